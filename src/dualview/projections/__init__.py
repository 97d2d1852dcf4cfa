"""Switched linear projections and inactive state sensitivity (Insens).

For an input ``x``, freeze every gate of a ReLU network (and every max-pool winner) at its value for
``x``. What remains is the *active sub-network*, an affine map, so every hidden neuron ``i`` computes

    q_i(x) = <x, w_i> + b_i                                   (Theorem 1 / Eq. 2 of the paper)

with the *switched weight* ``w_i = dq_i/dx`` and the *switched bias* ``b_i`` (written ŵ, b̂ in the
book; the paper calls the pre-activation ``q`` the neuron's *activity* ``v``)
:cite:`szymanski2020switched`. From them:

* the *switched centre* ``c_i = x - q_i w_i / |w_i|^2`` (Eq. 6), the point of the neuron's
  switching hyperplane nearest to ``x``;
* the *decomposition* ``q_i = sum_j (x_j - c_ij) w_ij`` (Eq. 4-5);
* the *inactive state sensitivity* ``Omega(x) = mean_{i inactive} q_i w_i / |w_i|^2`` (Eq. 7-8),
  averaged over the hidden neurons with ``q_i <= 0``.

Computation. The switched bias is the frozen network's pre-activation at input 0, and the
switched weights are its Jacobian: one forward-mode (dual-number) pass through the frozen network
(:func:`dualview.gates.run_with_gates`) per chunk of input basis vectors gives, for every hidden
neuron at once, one input coordinate of its switched weight. :func:`insens` needs only the squared
norms ``|w_i|^2`` (accumulated chunk by chunk, never holding more than one chunk of the Jacobian) and
then one reverse-mode pass, since ``Omega = J^T a`` with ``a_i = q_i / |w_i|^2 / |I|`` on inactive
neurons. On plain conv nets it builds the norms on the neurons' receptive fields instead
(:mod:`dualview.receptive_fields`). ``*_reference`` functions do the same with one autograd backward
per neuron.

Neurons. The hidden neurons are the units of every ReLU call, in the order
:func:`dualview.gates.record_gates` names them. A max-pool output is a copy of its window's winner,
not a neuron of its own, so it is never counted twice; this is the paper's exclusion of max-pool
winners from Eq. 8. Output units (no ReLU) are not hidden neurons. Their share with ``q > 0`` per
input (Table 3 of the paper) is :func:`dualview.gates.active_share` with ``per_layer=False``.

Cut-off neurons. A neuron whose every path to the input is switched off has ``w_i = 0``: its
pre-activation is the constant ``b_i`` near ``x``, it has no centre and no sensitivity. We mark it
(``cut_off``), give it a NaN centre and a zero ``omega``, and leave it out of the Insens average
(``InsensResult.n_cut_off`` counts them). Its decomposition is all zeros, so Eq. 5 holds for it only
when ``q_i = 0``.

Hard-clipped ReLUs (``nn.ReLU6``, ``nn.Hardtanh(0, t)``; :mod:`dualview.gates`) are hidden neurons too: frozen
with their gate ``1{0 < q < t}`` and their constant saturated piece, the network stays affine, so Theorem 1
holds as it stands. Insens keeps the paper's definition of the inactive state, ``q_i <= 0`` (Eq. 8: the
neurons whose activity is not positive, i.e. that output 0): a *saturated* unit (``q_i >= t``) has slope 0
too, but it is excited, not inactive (it outputs ``t``, and its switching hyperplane ``q_i = 0`` lies behind
the one at ``q_i = t``), so it is not averaged, as an active unit is not; ``n_inactive`` counts ``q_i <= 0``
only.

An in-place ``nn.ReLU(inplace=True)`` whose *input* tensor is read again later in ``forward`` (e.g.
``self.relu(x) + x``) is handled as PyTorch computes it: the later read gets the ReLU's output
(:mod:`dualview.gates` does the same inside the frozen network).
"""
from __future__ import annotations

from dualview.projections._frozen import frozen_preactivations  # noqa: F401
from dualview.projections.switched import (  # noqa: F401
    InsensResult,
    SwitchedProjections,
    _jacobian_chunks,
    insens,
    insens_reference,
    switched_projections,
    switched_projections_reference,
)
from dualview.projections.estimate import (  # noqa: F401
    InsensEstimate,
    NOISY_ESTIMATE,
    insens_estimate,
)

__all__ = [
    'SwitchedProjections', 'InsensResult', 'frozen_preactivations', 'switched_projections',
    'switched_projections_reference', 'insens', 'insens_reference', 'InsensEstimate', 'insens_estimate',
]

# the package's names are documented and shown as dualview.projections.<name> (where a reader of the book calls them)
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
