"""Trains a byte-level GPT from Python, eagerly and then compiled, and samples from it.

    python3 examples/python/train_gpt.py [--steps 200] [--compile] [--device cuda] [--data FILE]

The model is kiln.nn.GPT (C++); the training loop, the data and the sampling are Python. With
--compile the whole step (forward, backward, AdamW) is traced once and replayed.
"""
import argparse
import time

import numpy as np

import kiln


def batches(data, batch, context, rng, device):
    while True:
        starts = rng.integers(0, len(data) - context - 1, batch)
        x = np.stack([data[s:s + context] for s in starts]).astype(np.int64)
        y = np.stack([data[s + 1:s + context + 1] for s in starts]).astype(np.int64)
        yield kiln.from_numpy(x).to(device), kiln.from_numpy(y).to(device)


def sample(model, prompt, tokens, context, rng, device):
    idx = list(prompt)
    with kiln.no_grad():
        model.eval()
        for _ in range(tokens):
            logits = model(kiln.tensor([idx[-context:]], device=device))[0, -1]
            # On the cpu the array shares the tensor's memory; from a device it is a copy.
            probs = kiln.softmax(logits.double() / 0.8, -1).numpy(force=True)
            idx.append(int(rng.choice(256, p=probs / probs.sum())))
        model.train()
    return bytes(idx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or sim")
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    args = ap.parse_args()

    kiln.set_num_threads(args.threads)
    if args.device != "cpu":
        kiln.load_backend(args.device.split(":")[0])
    data = np.frombuffer(open(args.data, "rb").read(), dtype=np.uint8)
    gen = kiln.Generator(0)
    # kiln train's default (GPTConfig::tiny): width 64, 2 layers, 4 heads.
    model = kiln.nn.GPT(vocab_size=256, context=args.context, width=64, layers=2, heads=4,
                        generator=gen, device=args.device)
    opt = kiln.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        model.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        kiln.optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    train_step = kiln.compile(step, name="train_step") if args.compile else step
    stream = batches(data, args.batch, args.context, np.random.default_rng(0), args.device)
    start = time.perf_counter()
    for i in range(args.steps):
        x, y = next(stream)
        loss = train_step(x, y)
        if i % 50 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {loss.item():.3f}")
    took = time.perf_counter() - start
    print(f"{args.steps} steps in {took:.1f} s, "
          f"{args.steps * args.batch * args.context / took:,.0f} tokens/s")
    if args.compile:
        print(train_step.explain().splitlines()[0])
    print(sample(model, b"The GNU ", 80, args.context, np.random.default_rng(0),
                 args.device).decode(
        "utf-8", "replace"))


if __name__ == "__main__":
    main()
