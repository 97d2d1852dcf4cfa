"""Feature leveling: route every feature either one layer deeper or straight to the final linear layer.

A feature-leveling network (Section 3 of :cite:`featureleveling2020`) is a fully connected ReLU
network whose final linear layer (the *GLM layer*) reads, besides the last hidden layer, every
feature that some hidden layer chose *not* to pass on. At the input of hidden layer ``k`` each
feature ``j`` has a **routing gate** ``z_kj``: layer ``k`` reads ``z_kj`` times the feature, and the
GLM layer reads ``B(z_kj)`` times it, where ``B(z) = 1`` if ``z = 0`` exactly and ``0`` otherwise
(Eq. 4 of the paper: a feature reaches the GLM layer "if and only if the gate is exactly zero"). So
the routing is exclusive even in training, when ``z`` is sampled and may lie strictly between 0 and
1: such a feature goes deeper, scaled by ``z``, and not to the GLM layer. This is the default
``rule="binary"``; ``rule="complement"`` is a variant that instead sends ``(1 - z_kj)`` times the
feature to the GLM layer, fractional values going both ways in training. At test time ``z`` is fixed
to 0 or 1 and the two rules compute the same function: with ``z_kj = 0`` the feature is a
level-``k`` feature, read directly by the GLM layer. The word *gate* alone means, everywhere in this
book, the on/off state of a ReLU; the routing gates are a different object and are always called so.

Routing gates are *hard-concrete* random variables (:cite:`louizos2018learning`, Section 2.2): with
``u ~ U(0, 1)``, a learnable ``log_alpha``, the temperature ``temperature = 2/3`` (Louizos et al.'s
``beta``) and the stretch interval ``(gamma, zeta) = (-0.1, 1.1)``,

    s = sigmoid((log u - log(1 - u) + log_alpha) / temperature),   z = min(1, max(0, s (zeta - gamma) + gamma)),

so ``z`` is exactly 0 or exactly 1 with positive probability. The expected number of non-zero
routing gates, the expected L0 norm, has the closed form
``sum_j sigmoid(log_alpha_j - temperature log(-gamma/zeta))`` (Eq. 12 of Louizos et al.; the penalty
of Eq. 8 of the feature-leveling paper). At test time the routing gates are deterministic,
``z = min(1, max(0, sigmoid(log_alpha) (zeta - gamma) + gamma))``; the leveling networks round this
to 0 or 1 (a feature goes deeper iff ``log_alpha >= 0``) so that the test-time routing is exactly
exclusive.

This module holds :class:`HardConcreteRouting` (sampling, the test-time value, ``P(z = 0)``,
``P(z = 1)`` and the expected L0 penalty, in closed form); :class:`FeatureLevelingNet` (fully
connected) and :class:`ConvFeatureLevelingNet` (the convolutional variant of Appendix A.11), with
:func:`fcnn` and :func:`cnn` as the plain baselines; :func:`routing_summary`; and
:func:`fit_leveling`, the penalised objective of Eq. 8 trained by :func:`dualview.train.fit`. The
trained network is read level by level, and pruned, with :mod:`dualview.levels`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from dualview import nets, train

__all__ = [
    "HardConcreteRouting",
    "FeatureLevelingNet",
    "ConvFeatureLevelingNet",
    "Routing",
    "ROUTING_RULES",
    "fcnn",
    "cnn",
    "routing_summary",
    "l0_penalty",
    "fit_leveling",
    "glm_inputs_reference",
]

TEMPERATURE, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1

#: How a routing gate ``z`` weighs the copy of a feature sent to the GLM layer (the copy sent deeper is
#: always ``z`` times the feature). ``"binary"``: ``B(z) = 1[z == 0]``, Eq. 4 of the feature-leveling paper;
#: ``"complement"``: ``1 - z``. The two agree whenever ``z`` is 0 or 1 (always at test time).
ROUTING_RULES = ("binary", "complement")


def _check_rule(rule: str) -> str:
    if rule not in ROUTING_RULES:
        raise ValueError(f"rule must be one of {ROUTING_RULES} ('binary': a feature reaches the GLM layer only "
                         f"when its routing gate is exactly 0, Eq. 4 of the paper; 'complement': the GLM layer "
                         f"reads (1 - z) times it), got {rule!r}")
    return rule


# --------------------------------------------------------------------------------------------------
# Hard-concrete routing gates


class HardConcreteRouting(nn.Module):
    """``n`` hard-concrete routing gates with learnable ``log_alpha`` (:cite:`louizos2018learning`, Eq. 9-13).

    In training mode ``forward(batch_shape)`` samples one routing gate per feature and per sample, shape
    ``(*batch_shape, n)``; in eval mode it returns the deterministic test-time routing gates (shape
    ``(n,)``, which broadcast). ``temperature`` is the temperature of the sigmoid (Louizos et al.'s
    ``beta``, 2/3). ``init_log_alpha`` sets every routing gate's starting ``log_alpha``: the default 3
    opens a routing gate with probability ``P(z != 0) = 0.99`` (every feature starts by going deeper).
    """

    def __init__(self, n: int, init_log_alpha: float = 3.0, temperature: float = TEMPERATURE,
                 gamma: float = GAMMA, zeta: float = ZETA) -> None:
        super().__init__()
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"the number of routing gates must be a positive int, got {n!r}")
        if not temperature > 0:
            raise ValueError(f"the temperature must be positive, got {temperature!r}")
        if not (gamma < 0 and zeta > 1):
            raise ValueError(
                f"the stretch interval (gamma, zeta) must contain [0, 1] strictly (gamma < 0 < 1 < zeta), "
                f"so that z = 0 and z = 1 have positive probability; got ({gamma!r}, {zeta!r})"
            )
        self.n, self.temperature, self.gamma, self.zeta = int(n), float(temperature), float(gamma), float(zeta)
        self.log_alpha = nn.Parameter(torch.full((self.n,), float(init_log_alpha)))

    def extra_repr(self) -> str:
        return f"n={self.n}, temperature={self.temperature:.3g}, stretch=({self.gamma}, {self.zeta})"

    def sample(self, batch_shape: Sequence[int] = ()) -> Tensor:
        """Draw routing gates ``z`` of shape ``(*batch_shape, n)`` with the reparameterisation of Eq. 10."""
        la = self.log_alpha
        eps = torch.finfo(la.dtype).eps
        u = torch.rand(*batch_shape, self.n, device=la.device, dtype=la.dtype).clamp(eps, 1 - eps)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + la) / self.temperature)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def deterministic(self) -> Tensor:
        """The test-time routing gates ``min(1, max(0, sigmoid(log_alpha)(zeta - gamma) + gamma))`` (Eq. 13)."""
        return (torch.sigmoid(self.log_alpha) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def prob_zero(self) -> Tensor:
        """``P(z = 0) = sigmoid(temperature log(-gamma / zeta) - log_alpha)``, per routing gate (closed form)."""
        return torch.sigmoid(self.temperature * math.log(-self.gamma / self.zeta) - self.log_alpha)

    def prob_one(self) -> Tensor:
        """``P(z = 1) = sigmoid(log_alpha - temperature log((1 - gamma) / (zeta - 1)))``, per routing gate."""
        return torch.sigmoid(self.log_alpha - self.temperature * math.log((1 - self.gamma) / (self.zeta - 1)))

    def expected_l0(self) -> Tensor:
        """The expected L0 norm ``sum_j P(z_j != 0)`` (Eq. 12 of Louizos et al.; Eq. 8 of the paper)."""
        return (1 - self.prob_zero()).sum()

    def forward(self, batch_shape: Sequence[int] = ()) -> Tensor:
        return self.sample(batch_shape) if self.training else self.deterministic()


# --------------------------------------------------------------------------------------------------
# Networks


def _check_widths(widths: Sequence[int], out_features: int, what: str) -> list[int]:
    widths = list(widths)
    if len(widths) < 2 or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1
                              for w in widths + [out_features]):
        raise ValueError(
            f"{what} needs widths [input, hidden_1, ..., hidden_K] with K >= 1 hidden layers and a positive "
            f"out_features, all positive ints; got widths={widths!r}, out_features={out_features!r}"
        )
    return [int(w) for w in widths]


def fcnn(widths: Sequence[int], out_features: int) -> nn.Sequential:
    """The plain baseline: ``Flatten`` and :func:`dualview.nets.relu_mlp` with the widths of a leveling net."""
    widths = _check_widths(widths, out_features, "fcnn")
    return nn.Sequential(nn.Flatten(), *nets.relu_mlp([*widths, int(out_features)]))


class _Leveling(nn.Module):
    """What the fully connected and convolutional leveling networks share."""

    routing: nn.ModuleList
    rule: str

    def to_glm(self, z: Tensor) -> Tensor:
        """The weight of a feature's copy sent to the GLM layer, given its routing gate ``z``.

        ``rule="binary"`` (Eq. 4 of :cite:`featureleveling2020`): ``B(z) = 1`` iff ``z == 0``, so a
        feature whose routing gate is strictly positive goes deeper only, even while ``z`` is fractional in
        training. ``rule="complement"``: ``1 - z``. No gradient flows into ``z`` through ``B``.
        """
        if self.rule == "binary":
            return (z == 0).to(z.dtype)
        return 1 - z

    def _check_routing(self, routing: Sequence[Tensor] | None) -> None:
        if routing is None:
            return
        if len(routing) != len(self.routing):
            raise ValueError(f"routing must give one tensor of routing gates per hidden layer "
                             f"({len(self.routing)}), got {len(routing)}")
        for k, (z, hc) in enumerate(zip(routing, self.routing)):
            if z.shape[-1] != hc.n:
                raise ValueError(f"routing[{k}] must end in {hc.n} routing gates (one per input feature of "
                                 f"hidden layer {k + 1}), got shape {tuple(z.shape)}")

    def routing_gates(self) -> list[Tensor]:
        """The test-time routing gates of every hidden layer (0 or 1, detached).

        Louizos et al.'s test-time estimate ``z_hat`` (:meth:`HardConcreteRouting.deterministic`) rounded:
        a feature goes deeper iff ``z_hat >= 1/2``, that is iff ``log_alpha >= 0``. Rounding makes
        the routing exactly exclusive at test time; after training almost every ``z_hat`` is 0 or 1.
        """
        return [(g.deterministic().detach() >= 0.5).to(g.log_alpha.dtype) for g in self.routing]

    def _routing_gate(self, k: int, h: Tensor, routing: Sequence[Tensor] | None) -> Tensor:
        if routing is not None:
            return routing[k].to(device=h.device, dtype=h.dtype)
        hc = self.routing[k]
        if self.training:
            return hc.sample((h.shape[0],)).to(h.dtype)
        return (hc.deterministic() >= 0.5).to(h.dtype)

    def l0_penalty(self) -> Tensor:
        """The routing penalty of Eq. 8: ``(1/K) sum_k E||z_k||_0``, the expected number of features
        routed deeper, averaged over the ``K`` hidden layers (closed form, differentiable in ``log_alpha``)."""
        return torch.stack([g.expected_l0() for g in self.routing]).mean()

    def forward(self, x: Tensor, routing: Sequence[Tensor] | None = None) -> Tensor:
        """The output; ``routing`` (one tensor per hidden layer) replaces the routing gates if given."""
        parts = self.glm_inputs(x, routing)
        return self.glm(torch.cat(parts, 1))


class FeatureLevelingNet(_Leveling):
    """A fully connected feature-leveling network (Eq. 4 of :cite:`featureleveling2020`).

    ``widths = [d, w_1, ..., w_K]``: input dimension and hidden widths. Hidden layer ``k`` reads
    ``z_k * h_{k-1}`` (``h_0`` the flattened input) and outputs ``h_k = ReLU(W_k (z_k * h_{k-1}) + b_k)``;
    the GLM layer is one ``nn.Linear`` reading ``[B(z_1) h_0, ..., B(z_K) h_{K-1}, h_K]``. In
    training mode ``z`` is sampled per sample and feature; in eval mode it is the rounded test-time
    routing gate (``routing_gates``), 0 or 1, so every feature goes one way only.

    ``rule`` says what the GLM layer reads of a feature with routing gate ``z``: ``"binary"`` (default,
    the paper's Eq. 4) ``B(z) h`` with ``B(z) = 1[z == 0]``, so the routing is exclusive in training
    too; ``"complement"`` ``(1 - z) h`` (fractional routing gates send a feature both ways in training).
    The rules differ only in training: at test time the routing gates are 0 or 1.
    """

    def __init__(self, widths: Sequence[int], out_features: int, init_log_alpha: float = 3.0,
                 rule: str = "binary") -> None:
        super().__init__()
        self.rule = _check_rule(rule)
        self.widths = _check_widths(widths, out_features, "FeatureLevelingNet")
        self.out_features = int(out_features)
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(self.widths[:-1], self.widths[1:]))
        self.relus = nn.ModuleList(nn.ReLU() for _ in self.hidden)
        self.routing = nn.ModuleList(HardConcreteRouting(a, init_log_alpha) for a in self.widths[:-1])
        self.glm = nn.Linear(sum(self.widths), self.out_features)

    @property
    def level_sizes(self) -> list[int]:
        """Width of each block of the GLM input: ``[d, w_1, ..., w_{K-1}, w_K]``."""
        return list(self.widths)

    def glm_inputs(self, x: Tensor, routing: Sequence[Tensor] | None = None) -> list[Tensor]:
        """The blocks the GLM layer reads: the features routed to it at each layer, then ``h_K``."""
        h = x.flatten(1)
        if h.shape[1] != self.widths[0]:
            raise ValueError(f"expected inputs with {self.widths[0]} features (after flattening), got "
                             f"shape {tuple(x.shape)}")
        self._check_routing(routing)
        parts = []
        for k, (layer, relu) in enumerate(zip(self.hidden, self.relus)):
            z = self._routing_gate(k, h, routing)
            parts.append(h * self.to_glm(z))
            h = relu(layer(h * z))
        parts.append(h)
        return parts

    def hidden_part(self) -> nn.Sequential:
        """The plain FCNN this network becomes with every routing gate fixed to 1 (shared weights)."""
        layers: list[nn.Module] = [nn.Flatten()]
        for layer, relu in zip(self.hidden, self.relus):
            layers += [layer, relu]
        last = nn.Linear(self.widths[-1], self.out_features).to(self.glm.weight)
        with torch.no_grad():
            last.weight.copy_(self.glm.weight[:, -self.widths[-1]:])
            last.bias.copy_(self.glm.bias)
        return nn.Sequential(*layers, last)


def cnn(in_channels: int, channels: Sequence[int], image_size: int, out_features: int,
        kernel_size: int = 3) -> nn.Sequential:
    """The plain convolutional baseline of :class:`ConvFeatureLevelingNet` (conv, ReLU, 2x2 max-pool per layer)."""
    widths = _check_widths([in_channels, *channels], out_features, "cnn")
    layers: list[nn.Module] = []
    size = image_size
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Conv2d(a, b, kernel_size, padding=kernel_size // 2), nn.ReLU(), nn.MaxPool2d(2)]
        size //= 2
    layers += [nn.Flatten(), nn.Linear(widths[-1] * size * size, out_features)]
    return nn.Sequential(*layers)


class ConvFeatureLevelingNet(_Leveling):
    """The convolutional variant (Section 5.4 and Appendix A.11 of :cite:`featureleveling2020`).

    Layer ``k`` is ``Conv2d -> ReLU -> MaxPool2d(2)`` on ``z_k * h_{k-1}`` (one routing gate per
    channel, scaling the whole map). The channels routed to the GLM layer, ``B(z_k) * h_{k-1}`` (or
    ``(1 - z_k) * h_{k-1}`` with ``rule="complement"``, as in :class:`FeatureLevelingNet`), are first
    reduced by a linear 1x1 convolution to ``reduce_channels`` maps (no
    activation, so the GLM layer stays linear in the level features), then flattened.
    """

    def __init__(self, in_channels: int, channels: Sequence[int], image_size: int, out_features: int,
                 kernel_size: int = 3, reduce_channels: int = 1, init_log_alpha: float = 3.0,
                 rule: str = "binary") -> None:
        super().__init__()
        self.rule = _check_rule(rule)
        widths = _check_widths([in_channels, *channels], out_features, "ConvFeatureLevelingNet")
        if image_size < 2 ** len(channels) or reduce_channels < 1:
            raise ValueError(f"image_size {image_size} is too small for {len(channels)} 2x2 poolings, or "
                             f"reduce_channels {reduce_channels} < 1")
        self.widths, self.image_size, self.out_features = widths, int(image_size), int(out_features)
        self.hidden = nn.ModuleList(nn.Conv2d(a, b, kernel_size, padding=kernel_size // 2)
                                    for a, b in zip(widths[:-1], widths[1:]))
        self.relus = nn.ModuleList(nn.ReLU() for _ in self.hidden)
        self.pools = nn.ModuleList(nn.MaxPool2d(2) for _ in self.hidden)
        self.reduce = nn.ModuleList(nn.Conv2d(a, reduce_channels, 1, bias=False) for a in widths[:-1])
        self.routing = nn.ModuleList(HardConcreteRouting(a, init_log_alpha) for a in widths[:-1])
        sizes = [image_size // 2 ** k for k in range(len(widths))]
        self.level_sizes = [reduce_channels * s * s for s in sizes[:-1]] + [widths[-1] * sizes[-1] ** 2]
        self.glm = nn.Linear(sum(self.level_sizes), out_features)

    def glm_inputs(self, x: Tensor, routing: Sequence[Tensor] | None = None) -> list[Tensor]:
        """Blocks the GLM layer reads: reduced routed maps of each layer (flattened), then ``h_K``."""
        if x.dim() != 4 or x.shape[1] != self.widths[0] or x.shape[-1] != self.image_size:
            raise ValueError(f"expected images (N, {self.widths[0]}, {self.image_size}, {self.image_size}), "
                             f"got shape {tuple(x.shape)}")
        self._check_routing(routing)
        h, parts = x, []
        for k in range(len(self.hidden)):
            z = self._routing_gate(k, h, routing)
            z = z[..., None, None]
            parts.append(self.reduce[k](h * self.to_glm(z)).flatten(1))
            h = self.pools[k](self.relus[k](self.hidden[k](h * z)))
        parts.append(h.flatten(1))
        return parts


# --------------------------------------------------------------------------------------------------
# Routing after training, and training


@dataclass
class Routing:
    """Where the test-time routing gates send the features of each hidden layer's input.

    ``deeper[k]`` and ``to_glm[k]`` count the features of ``h_k`` (``h_0`` the input) that enter
    hidden layer ``k + 1`` and that go to the GLM layer; ``depth`` is the number of hidden layers
    that still compute something (the layers before the first one that receives no feature).
    """

    deeper: list[int]
    to_glm: list[int]
    depth: int

    @property
    def levels(self) -> int:
        """Number of feature levels the GLM layer reads: one per remaining layer, plus the last output."""
        return self.depth + 1


def routing_summary(model: _Leveling) -> Routing:
    """Count, per hidden layer, the features routed deeper and to the GLM layer (test-time routing gates)."""
    if not isinstance(model, _Leveling):
        raise TypeError(f"routing_summary expects a feature-leveling network, got {type(model).__name__}")
    zs = model.routing_gates()
    deeper = [int((z > 0).sum()) for z in zs]
    depth = next((k for k, n in enumerate(deeper) if n == 0), len(deeper))
    return Routing(deeper, [int((z == 0).sum()) for z in zs], depth)


def l0_penalty(model: nn.Module) -> Tensor:
    """The routing penalty of Eq. 8 of :cite:`featureleveling2020` of a feature-leveling network: the expected
    number of features routed deeper, averaged over its hidden layers (``FeatureLevelingNet.l0_penalty``)."""
    if not isinstance(model, _Leveling):
        raise TypeError(f"l0_penalty expects a feature-leveling network, got {type(model).__name__}")
    return model.l0_penalty()


def fit_leveling(model: nn.Module, train_data, epochs: int, lam: float = 0.0, lr: float = 1e-3,
                 routing_lr: float | None = None, weight_decay: float = 0.0, warmup: int = 0, finetune: int = 0,
                 **fit_kwargs) -> train.History:
    """Minimise the task loss plus ``lam`` times the routing penalty (Eq. 8 of :cite:`featureleveling2020`)
    with :func:`dualview.train.fit` (Adam).

    ``routing_lr`` is the learning rate of the routing parameters ``log_alpha`` (default ``lr``; they
    get no weight decay). ``warmup``: the penalty grows linearly from 0 to ``lam`` over the first
    ``warmup`` epochs (so hidden layers learn before routes close). ``finetune``: after ``epochs``
    epochs, train this many more with the routing gates fixed at their test-time values (no
    sampling, no penalty), so the weights fit the final routing. Other keyword arguments (``task``,
    ``batch_size``, ``test``, ``seed``, ``progress``) go to :func:`~dualview.train.fit`. The history
    records the penalty every epoch and, as ``records["deeper"]``, the features routed deeper per layer, and
    as ``records["routing"]`` the test-time routing gates of every hidden layer (``model.routing_gates()``, on the CPU).
    """
    if not isinstance(model, _Leveling):
        raise TypeError(f"fit_leveling trains a feature-leveling network, got {type(model).__name__}; "
                        "train other networks with dualview.train.fit")
    if epochs < 0 or finetune < 0 or warmup < 0 or lam < 0:
        raise ValueError(f"need epochs, finetune, warmup >= 0 and lam >= 0; got {epochs}, {finetune}, {warmup}, "
                         f"{lam}")
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not n.endswith("log_alpha")], "weight_decay": weight_decay},
              {"params": [p for n, p in named if n.endswith("log_alpha")], "lr": routing_lr or lr,
               "weight_decay": 0.0}]

    def penalty_weight(epoch: int) -> float:
        if epoch >= epochs:  # fine-tuning: fixed routing, no penalty
            return 0.0
        return lam * min(1.0, epoch / warmup) if warmup > 0 else lam

    def forward(net: _Leveling, x: Tensor, epoch: int) -> Tensor:
        return net(x) if epoch < epochs else net(x, routing=net.routing_gates())

    return train.fit(model, train_data, epochs + finetune, lr=lr, parameters=groups, penalty=l0_penalty,
                     penalty_weight=penalty_weight, forward=forward,
                     record={"deeper": lambda net: routing_summary(net).deeper,
                             "routing": lambda net: [z.cpu() for z in net.routing_gates()]}, **fit_kwargs)


def glm_inputs_reference(model: FeatureLevelingNet, x: Tensor, routing: Sequence[Tensor]) -> list[Tensor]:
    """What the GLM layer of a :class:`FeatureLevelingNet` reads, one sample and one feature at a time.

    The slow, obviously-correct reference for :meth:`FeatureLevelingNet.glm_inputs` with given routing
    gates ``routing[k]`` of shape ``(n_k,)`` or ``(N, n_k)``: for sample ``i`` and feature ``j`` of
    ``h_{k-1}``, the GLM layer receives ``h_{k-1, ij}`` if ``z_kij == 0`` and ``0`` otherwise under the
    paper's rule (Eq. 4), or ``(1 - z_kij) h_{k-1, ij}`` under ``rule="complement"``; hidden layer ``k``
    receives ``z_kij h_{k-1, ij}`` and computes ``ReLU(sum_j W_mj (z h)_j + b_m)`` unit by unit.
    """
    rows: list[list[list[float]]] = [[] for _ in model.widths[:-1]] + [[]]
    for i, xi in enumerate(x.flatten(1).tolist()):
        h = xi
        for k, layer in enumerate(model.hidden):
            z = routing[k] if routing[k].dim() == 1 else routing[k][i]
            z = z.tolist()
            if model.rule == "binary":
                rows[k].append([hj if zj == 0 else 0.0 for hj, zj in zip(h, z)])
            else:
                rows[k].append([(1.0 - zj) * hj for hj, zj in zip(h, z)])
            inp = [zj * hj for hj, zj in zip(h, z)]
            W, b = layer.weight.tolist(), layer.bias.tolist()
            h = [max(0.0, sum(w * v for w, v in zip(W[m], inp)) + b[m]) for m in range(len(b))]
        rows[-1].append(h)
    dt = model.glm.weight.dtype
    return [torch.tensor(r, dtype=dt) for r in rows]
