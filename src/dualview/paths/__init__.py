"""Paths: neural path features, neural path values and path activity; counting paths.

For a fully connected ReLU network with layers ``W_1 ... W_L`` a *path* ``p`` picks one unit in every
layer, from an input coordinate to an output unit. Definition E.1 of the duality paper
:cite:`lakshminarayanan2022explicitising`: the *activity* of a path is the product of the gates along
it, ``A(x, p) = prod_l G_l(x)[p_l]``; its *neural path feature* (NPF) is ``phi(x)_p = x[p_0] * A(x, p)``;
its *neural path value* (NPV) is the product of the weights along it, ``v_p = prod_l W_l[p_l, p_{l-1}]``;
and the network's output is ``f(x) = <phi(x), v>`` (Eq. 1 there; Eq. 17-19 of
:cite:`satkiewicz2025tapping`). With soft gates ``sigmoid(q / temperature)`` in place of ``G`` (a
``temperature`` argument, 0 = hard gates) the same inner product gives the soft-gated network (Eq. 18-20).

**Biases** are handled with the augmented-input convention of :cite:`satkiewicz2025tapping`
(Section 2.1): every layer's input gets an extra constant unit equal to 1 whose gate is always on,
and ``W~_l = [[W_l, b_l], [0, 1]]``. A path that starts at the constant unit and stays on the
constant units until layer ``l`` carries the bias ``b_{l+1}[j]`` of the unit ``j`` it then enters:
biases are *bias paths*. Paths that would go from an ordinary unit back to a constant unit have
value 0 and are left out, so ``P`` counts the paths that exist in the network:
``P = d_0 w_1 ... w_{L-1}`` input paths plus one family of bias paths per layer with a bias.

The explicit enumeration is for small networks (teaching and testing): ``P`` grows like the product of
the widths. :func:`count_paths` counts paths of any supported network (convolutions and pooling
included) without enumerating them, running a unit-weight copy under :func:`dualview.gates.instrument`.
"""
from __future__ import annotations

from dualview.paths.features import (  # noqa: F401
    fc_layers,
    neural_path_features,
    neural_path_features_reference,
    neural_path_values,
    neural_path_values_reference,
    path_activity,
    path_index,
)
from dualview.paths.counting import (  # noqa: F401
    PathCount,
    conv_path_count,
    count_paths,
    fc_path_count,
    parameter_count,
    register_unit_rule,
    resnet_path_count,
    unit_network,
    unregister_unit_rule,
)

__all__ = [
    'fc_layers', 'path_index', 'path_activity', 'neural_path_features', 'neural_path_values',
    'neural_path_features_reference', 'neural_path_values_reference', 'fc_path_count', 'conv_path_count',
    'resnet_path_count', 'parameter_count', 'unit_network', 'PathCount', 'count_paths', 'register_unit_rule',
    'unregister_unit_rule',
]

# the package's names are documented and shown as dualview.paths.<name> (where a reader of the book calls them)
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
