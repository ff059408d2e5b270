"""kiln.nn and kiln.optim from Python: Python subclasses of Module holding built-in (C++)
modules, state dicts, optimizers, and a Python model trained to the same losses as the same
model built from the C++ modules."""
import numpy as np
import pytest

import kiln
from conftest import close


class MLP(kiln.nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.fc1 = kiln.nn.Linear(8, 16, generator=gen)
        self.act = kiln.nn.GELU()
        self.fc2 = kiln.nn.Linear(16, 4, generator=gen)
        self.scale = kiln.nn.Parameter(kiln.ones(4))
        self.register_buffer("calls", kiln.zeros(1))

    def forward(self, x):
        self.calls += 1
        return self.fc2(self.act(self.fc1(x))) * self.scale


class HandMLP(kiln.nn.Module):
    """The same model with its layers written in Python over kiln's functions."""

    def __init__(self, like):
        super().__init__()
        self.w1 = kiln.nn.Parameter(like.fc1.weight.clone())
        self.b1 = kiln.nn.Parameter(like.fc1.bias.clone())
        self.w2 = kiln.nn.Parameter(like.fc2.weight.clone())
        self.b2 = kiln.nn.Parameter(like.fc2.bias.clone())
        self.scale = kiln.nn.Parameter(kiln.ones(4))

    def forward(self, x):
        h = kiln.gelu(kiln.linear(x, self.w1, self.b1))
        return kiln.linear(h, self.w2, self.b2) * self.scale


def test_parameters_buffers_and_submodules_register_themselves():
    m = MLP(kiln.Generator(0))
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [n for n, _ in m.named_buffers()] == ["calls"]
    assert m.num_parameters() == 4 + 8 * 16 + 16 + 16 * 4 + 4
    assert isinstance(m.fc1, kiln.nn.Module)
    assert list(m.state_dict()) == names + ["calls"]
    m.eval()
    assert not m.training and not m.fc1.training
    m.train()
    assert m.fc2.training
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        m.nope


def test_forgetting_super_init_is_a_clear_error():
    class Bad(kiln.nn.Module):
        def __init__(self):
            self.w = kiln.nn.Parameter(kiln.ones(2))

    with pytest.raises(AttributeError, match=r"\[Module\] Bad.__init__ must call super"):
        Bad()


def test_state_dict_round_trips_through_safetensors(tmp_path):
    a, b = MLP(kiln.Generator(1)), MLP(kiln.Generator(2))
    path = str(tmp_path / "m.safetensors")
    kiln.save(a.state_dict(), path)
    loaded = kiln.load(path)
    b.load_state_dict(loaded)
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and ta.tolist() == tb.tolist()
    with pytest.raises(ValueError, match=r"\[load_state_dict\] missing \['scale'\]"):
        b.load_state_dict({k: v for k, v in loaded.items() if k != "scale"})
    with pytest.raises(ValueError, match="safetensors"):
        open(str(tmp_path / "bad"), "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
        kiln.load(str(tmp_path / "bad"))


def test_python_module_trains_to_the_same_losses_as_the_cpp_modules(rng):
    gen = kiln.Generator(0)
    cpp = MLP(gen)
    hand = HandMLP(cpp)
    x = kiln.from_numpy(rng.standard_normal((32, 8)).astype(np.float32))
    y = kiln.from_numpy(rng.integers(0, 4, 32))
    opt_c = kiln.optim.AdamW(cpp.parameters(), lr=1e-2)
    opt_h = kiln.optim.AdamW(hand.parameters(), lr=1e-2)
    losses_c, losses_h = [], []
    for _ in range(20):
        for model, opt, losses in ((cpp, opt_c, losses_c), (hand, opt_h, losses_h)):
            opt.zero_grad()
            loss = kiln.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses_c == losses_h  # bitwise: the same kernels in the same order
    assert losses_c[-1] < losses_c[0] * 0.8
    assert cpp.calls.item() == 20.0


def test_sgd_matches_its_formula_and_clip_grad_norm():
    w = kiln.tensor([1.0, -2.0], dtype=kiln.float64, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    # buf1 = g0 = 2w0; w1 = w0 - 0.1 g0; buf2 = 0.9 buf1 + 2 w1; w2 = w1 - 0.1 buf2
    w0 = np.array([1.0, -2.0])
    w1 = w0 - 0.1 * 2 * w0
    w2 = w1 - 0.1 * (0.9 * 2 * w0 + 2 * w1)
    close(w, w2, rtol=1e-12)
    assert opt.steps == 2
    opt.lr = 0.5
    assert opt.lr == 0.5
    w.grad = kiln.tensor([3.0, 4.0], dtype=kiln.float64)
    norm = kiln.optim.clip_grad_norm_([w], 1.0)
    close(norm, 5.0)
    close(w.grad, [0.6, 0.8], rtol=1e-6)


def test_gpt_trains_from_python_and_compiles():
    gen = kiln.Generator(0)
    model = kiln.nn.GPT(vocab_size=64, context=16, width=32, layers=2, heads=2, generator=gen)
    opt = kiln.optim.AdamW(model.parameters(), lr=3e-3)
    idx = kiln.randint(0, 64, (4, 16), generator=gen)

    def step(i, t):
        model.zero_grad()
        loss = model.loss(i, t)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = kiln.compile(step)
    losses = [compiled(idx, idx).item() for _ in range(15)]
    assert losses[-1] < losses[0]
    assert compiled.explain().count("hits") >= 1


def test_every_builtin_module_runs_forward_and_backward():
    g = kiln.Generator(0)
    cases = [
        (kiln.nn.Conv1d(2, 3, 3, padding=1, generator=g), (2, 2, 8), (2, 3, 8)),
        (kiln.nn.Conv2d(2, 4, (3, 3), stride=2, generator=g), (2, 2, 9, 9), (2, 4, 4, 4)),
        (kiln.nn.Conv2d(2, 4, 3, padding="same", generator=g), (1, 2, 5, 5), (1, 4, 5, 5)),
        (kiln.nn.Conv3d(1, 2, 2, generator=g), (1, 1, 3, 3, 3), (1, 2, 2, 2, 2)),
        (kiln.nn.ConvTranspose2d(3, 2, 2, stride=2, generator=g), (1, 3, 4, 4), (1, 2, 8, 8)),
        (kiln.nn.ConvTranspose1d(3, 2, 3, generator=g), (1, 3, 4), (1, 2, 6)),
        (kiln.nn.BatchNorm1d(3), (4, 3), (4, 3)),
        (kiln.nn.BatchNorm2d(3), (4, 3, 2, 2), (4, 3, 2, 2)),
        (kiln.nn.BatchNorm3d(2), (2, 2, 2, 2, 2), (2, 2, 2, 2, 2)),
        (kiln.nn.GroupNorm(2, 4), (2, 4, 3), (2, 4, 3)),
        (kiln.nn.MaxPool2d(2), (1, 1, 4, 4), (1, 1, 2, 2)),
        (kiln.nn.AvgPool2d(2, stride=1), (1, 1, 3, 3), (1, 1, 2, 2)),
        (kiln.nn.AdaptiveAvgPool2d([1, 1]), (2, 3, 5, 5), (2, 3, 1, 1)),
        (kiln.nn.Upsample(scale_factor=2.0, mode="bilinear"), (1, 1, 2, 2), (1, 1, 4, 4)),
        (kiln.nn.Flatten(), (2, 3, 4), (2, 12)),
        (kiln.nn.LayerNorm(4), (2, 4), (2, 4)),
        (kiln.nn.RMSNorm(4), (2, 4), (2, 4)),
        (kiln.nn.MLP(8, generator=g), (2, 8), (2, 8)),
        (kiln.nn.CausalSelfAttention(8, 2, generator=g), (2, 3, 8), (2, 3, 8)),
        (kiln.nn.Block(8, 2, generator=g), (2, 3, 8), (2, 3, 8)),
        (kiln.nn.CNN(image_size=8, channels=[4], hidden=0, generator=g), (2, 1, 8, 8), (2, 10)),
    ]
    for module, shape, want in cases:
        x = kiln.randn(*shape, generator=g).requires_grad_()
        y = module(x)
        assert y.shape == want, (module, y.shape)
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == shape, module
    bag = kiln.nn.EmbeddingBag(10, 3, mode="sum", generator=g)
    out = bag(kiln.tensor([[1, 2], [3, 3]]))
    close(out, (bag.state_dict()["weight"].numpy()[[1, 3]] + bag.state_dict()["weight"].numpy()[[2, 3]]))
    with pytest.raises(ValueError):
        kiln.nn.Conv2d(2, 4, 3, generator=g)(kiln.ones(1, 3, 5, 5))


def test_conv_module_matches_the_functional_op(rng):
    conv = kiln.nn.Conv2d(3, 2, 3, padding=1, generator=kiln.Generator(1))
    x = kiln.from_numpy(rng.standard_normal((1, 3, 6, 6)).astype(np.float32))
    want = kiln.convolution(x, conv.weight, conv.bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    close(conv(x), want.detach().numpy())


def test_checkpoint_recomputes_and_gives_the_same_gradients():
    g = kiln.Generator(0)
    lin = kiln.nn.Linear(6, 6, generator=g)
    x = kiln.randn(4, 6, generator=g, requires_grad=True)

    def block(t):
        return kiln.tanh(lin(t)) * 2

    calls = []

    def counted(t):
        calls.append(1)
        return block(t)

    kiln.nn.checkpoint(counted, x).sum().backward()
    g_ckpt, w_ckpt = x.grad.tolist(), lin.weight.grad.tolist()
    assert len(calls) == 2  # forward, then again in backward
    x.grad, lin.weight.grad = None, None
    block(x).sum().backward()
    assert x.grad.tolist() == g_ckpt and lin.weight.grad.tolist() == w_ckpt


def test_warmup_cosine_schedule():
    s = kiln.optim.WarmupCosineLR(1.0, 0.1, 10, 110)
    assert s(0) < s(5) < s(10) and abs(s(10) - 1.0) < 1e-12
    assert abs(s(110) - 0.1) < 1e-12 and s(60) < s(20)
