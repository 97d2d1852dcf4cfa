"""The introduction's figure (scripts/intro_figure.py) is drawn from a network, and shows what its caption says:
the two inputs switch on different gates (different sub-networks, different regions)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import intro_figure  # noqa: E402

from dualview import gates  # noqa: E402


def test_the_two_inputs_switch_on_different_gates(tmp_path):
    net = intro_figure.network()
    a, b = torch.tensor([[1.0, 0.2]], dtype=torch.float64), torch.tensor([[-0.5, 1.0]], dtype=torch.float64)
    ga, gb = gates.record_gates(net, a).gates, gates.record_gates(net, b).gates
    assert any(not torch.equal(ga[k], gb[k]) for k in ga)
    assert any(not bool(g.all()) for g in ga.values()) and any(not bool(g.all()) for g in gb.values())
    intro_figure.main(tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
    assert (ROOT / "book" / "images" / "dual_view.png").exists()
