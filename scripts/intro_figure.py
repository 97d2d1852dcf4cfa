"""The introduction's figure (book/images/dual_view.png): one small ReLU network, two inputs, two sub-networks.

    python scripts/intro_figure.py [OUT.png]

A 2-3-3-1 network with chosen weights. Left and middle: the paths each input switches on (gates on in colour,
off in grey; a path counts when every gate along it is on). Right: the input plane coloured by the gate pattern;
on each region the network is one linear map, and the two inputs sit in different regions. Drawn from the
network itself (dualview.gates.record_gates), so the picture is what the network computes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from dualview import gates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "images" / "dual_view.png"


def network() -> nn.Sequential:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1)).double()
    weights = [([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]], [0.0, 0.0, 0.0]),
               ([[1.0, 0.5, 0.0], [-0.5, 1.0, 0.5], [0.5, -1.0, 1.0]], [0.0, -0.2, 0.0]),
               ([[1.0, -1.0, 0.5]], [0.0])]
    with torch.no_grad():
        for layer, (w, b) in zip((net[0], net[2], net[4]), weights):
            layer.weight.copy_(torch.tensor(w))
            layer.bias.copy_(torch.tensor(b))
    return net.eval()


def draw_paths(ax, net, x, name, colour) -> None:
    rec = gates.record_gates(net, x[None])
    on = [torch.ones(2, dtype=torch.bool)] + [g[0] for g in rec.gates.values()] + [torch.ones(1, dtype=torch.bool)]
    widths = [2, 3, 3, 1]
    pos = [[(k, (w - 1) / 2 - j) for j in range(w)] for k, w in enumerate(widths)]
    weights = [net[0].weight.detach(), net[2].weight.detach(), net[4].weight.detach()]
    for k in range(3):  # an edge is on a path of x when both its ends are on
        for i, (xa, ya) in enumerate(pos[k]):
            for j, (xb, yb) in enumerate(pos[k + 1]):
                if float(weights[k][j, i]) == 0.0:
                    continue
                live = bool(on[k][i]) and bool(on[k + 1][j])
                ax.plot([xa, xb], [ya, yb], color=colour if live else "0.85", lw=2.2 if live else 1.0, zorder=1)
    for k, layer in enumerate(pos):
        for j, (px, py) in enumerate(layer):
            ax.scatter(px, py, s=260, color=colour if bool(on[k][j]) else "white", edgecolors="0.3", zorder=2)
    ax.set_title(f"input {name} = ({x[0]:g}, {x[1]:g}): gates on, active paths", fontsize=10)
    ax.axis("off")


def main(out: Path = OUT) -> None:
    net = network()
    a, b = torch.tensor([1.0, 0.2], dtype=torch.float64), torch.tensor([-0.5, 1.0], dtype=torch.float64)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1, 1.15]})
    draw_paths(axes[0], net, a, "a", "tab:orange")
    draw_paths(axes[1], net, b, "b", "tab:blue")
    grid = torch.linspace(-1.5, 1.5, 301, dtype=torch.float64)
    xx, yy = torch.meshgrid(grid, grid, indexing="xy")
    pts = torch.stack([xx.flatten(), yy.flatten()], 1)
    rec = gates.record_gates(net, pts)
    pattern = torch.cat([g.flatten(1) for g in rec.gates.values()], 1).long()
    codes = (pattern * (2 ** torch.arange(pattern.shape[1]))).sum(1)
    _, region = torch.unique(codes, return_inverse=True)
    axes[2].imshow(region.view(301, 301).numpy() % 10, origin="lower", extent=(-1.5, 1.5, -1.5, 1.5),
                   cmap="tab10", alpha=0.45, interpolation="nearest")
    for x, name, colour in ((a, "a", "tab:orange"), (b, "b", "tab:blue")):
        axes[2].scatter(*x.tolist(), s=80, color=colour, edgecolors="black", zorder=3)
        axes[2].annotate(name, x.tolist(), xytext=(6, 6), textcoords="offset points", fontsize=11)
    axes[2].set_title("regions of equal gates: one linear map each", fontsize=10)
    axes[2].set_xlabel("$x_1$")
    axes[2].set_ylabel("$x_2$")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
