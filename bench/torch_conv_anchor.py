# PyTorch's side of `kiln bench conv` and `kiln bench cnn` (issue 16) on the GPU machine:
# conv2d at ResNet-50's shapes (the list in tools/kiln/cnn_workload.cpp), forward and forward +
# backward for the input and the weight, batch 32, float32; and the train step of the same CNN
# as kiln::nn::CNN (conv-BN-ReLU-maxpool x2, Linear 128, Linear 10; AdamW, batch 64), eager and
# as a captured CUDA graph. cudnn.benchmark on, TF32 allowed (Kiln's cuDNN convolutions search
# for the fastest algorithm and allow TF32 alike). Prints JSON with the Kiln workloads' keys.
# Run: python3 bench/torch_conv_anchor.py [out.json]
import json, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
SHAPES = [  # name, in, out, size, kernel, stride, padding
    ("stem_7x7_s2", 3, 64, 224, 7, 2, 3), ("res2_1x1", 256, 64, 56, 1, 1, 0),
    ("res2_3x3", 64, 64, 56, 3, 1, 1), ("res3_3x3_s2", 128, 128, 56, 3, 2, 1),
    ("res3_3x3", 128, 128, 28, 3, 1, 1), ("res4_3x3", 256, 256, 14, 3, 1, 1),
    ("res5_3x3", 512, 512, 7, 3, 1, 1)]


def per_call_us(fn, iters, repeats=3, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / iters)
    return statistics.median(runs) * 1e6


out = {"conv_batch": 32}
for name, cin, cout, size, k, s, p in SHAPES:
    x = torch.randn(32, cin, size, size, device=dev, requires_grad=True)
    w = (torch.randn(cout, cin, k, k, device=dev) / (cin * k * k) ** 0.5).requires_grad_()
    g = torch.ones_like(F.conv2d(x, w, None, s, p))

    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, None, s, p)

    def fwdbwd():
        x.grad = w.grad = None
        F.conv2d(x, w, None, s, p).backward(g)

    out[f"conv_{name}_fwd_us"] = per_call_us(fwd, 20)
    out[f"conv_{name}_fwdbwd_us"] = per_call_us(fwdbwd, 20)


class CNN(nn.Module):
    def __init__(s):
        super().__init__()
        layers, cin = [], 1
        for c in (32, 64):
            layers += [nn.Conv2d(cin, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                       nn.MaxPool2d(2)]
            cin = c
        s.features = nn.Sequential(*layers)
        s.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                                     nn.Linear(128, 10))

    def forward(s, x):
        return s.classifier(s.features(x))


model = CNN().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
x = torch.randn(64, 1, 28, 28, device=dev)
y = torch.randint(0, 10, (64,), device=dev)


def step():
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


out["cnn_step_us"] = per_call_us(step, 50)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    step()
out["cnn_step_graph_us"] = per_call_us(graph.replay, 50)
out["torch"] = torch.__version__
print(json.dumps(out, indent=1))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
