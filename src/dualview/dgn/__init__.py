"""Deep gated networks (DGN): one gated network class for DGNs, DLGNs and fixed gates.

A ReLU network entangles two jobs in every layer: the weights compute pre-activations, and the ReLUs
switch units on and off. The *deep gated network* of :cite:`lakshminarayanan2020neural` (Figure 2 and
Appendix D of :cite:`lakshminarayanan2022explicitising`) gives them to two networks of one architecture:

* the **gating network** sees ``x`` and produces a pre-activation ``q_l`` at every ReLU position ``l`` (a
  *gate site*); the gate is ``G_l = 1{q_l > 0}`` (hard, ``temperature = 0``) or ``sigmoid(q_l / temperature)``
  (soft; the papers' ``sigmoid(beta q_l)`` with ``beta = 10`` is ``temperature = 0.1``);
* the **value network** has a *gated linear unit* (:class:`GaLU`) ``z_l = q^v_l * G_l``
  :cite:`fiat2019decoupling` in place of every ReLU. Its input is ``x`` or the constant ``1``
  ("DGN-ALLONES", Section 4.1 there), and its gate layers may receive the gates in a permuted order
  (Figure 3 there: value site ``l`` gets ``G_{pi(l)}``).

With ReLUs in the gating network this is a DGN; with the identity it is a DLGN, whose gating
pre-activations are affine in the input (Section 5 there, "primal linearity";
:func:`dualview.hyperplanes.effective_hyperplanes`). Shallow-feature gating (DLGN-SF, Section 3.3 of
:cite:`lakshminarayanan2022disentangling`) computes each gate layer from the input with one linear layer.
:class:`GatedNetwork` is all of these, built from any two networks with the same ReLUs (by default
with the frozen, hard gates of the second: the fixed gates of the NPK/NTK theorems) or by :func:`build`
from an :class:`~dualview.architectures.Architecture`::

    arch = Architecture.c4gap(width=128)
    dnn = dgn.build(arch, "dnn")                         # the ReLU network
    st = dgn.build(arch, "dgn", value_input="ones")      # standalone (ST): soft gates, both trained
    pg = dgn.build(arch, "dgn", pretrained=dnn)          # pretrained gates (PG): frozen, hard
    dlgn = dgn.build(arch, "dlgn", permutation=(3, 2, 1, 0))
    fixed = dgn.GatedNetwork(value_net, gating_net)      # the fixed gates of gating_net
    resnet = dgn.GatedNetwork.from_model(torchvision.models.resnet18())  # any traceable model

Max-pools stay max-pools in both networks; the value network pools its own signal
(:func:`dualview.gates.run_with_gates` imposes the gating network's winners too, if you want them).
"""
from __future__ import annotations

from dualview.dgn.networks import (  # noqa: F401
    DeepGating,
    GaLU,
    GatedNetwork,
    GatedTrace,
    ShallowGating,
    one_relu_per_use,
)
from dualview.dgn.building import (  # noqa: F401
    build,
    gated_forward_reference,
    reverse_within_blocks,
    sample_permutations,
)

__all__ = [
    'GaLU', 'DeepGating', 'ShallowGating', 'GatedNetwork', 'GatedTrace', 'build', 'reverse_within_blocks',
    'sample_permutations', 'gated_forward_reference', 'one_relu_per_use',
]

# the package's names are documented and shown as dualview.dgn.<name> (where a reader of the book calls them)
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
