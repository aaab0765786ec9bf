"""Your own training script, as it is: trainyard sends it with the spec (``localpath``).

A small PyTorch regression, on CPU, that prints its loss and saves its model where it is told
(``--out``: the task's ``{{output}}`` folder, kept after the run). Replace it with yours.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    y = x @ torch.tensor([2.0, -1.0, 0.5]) + 0.3 + 0.1 * torch.randn(256)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(1, args.steps + 1):
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "model.pt")
    print(f"saved {args.out / 'model.pt'}")


if __name__ == "__main__":
    main()
