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
``u ~ U(0, 1)``, a learnable ``log_alpha``, temperature ``beta = 2/3`` and the stretch interval
``(gamma, zeta) = (-0.1, 1.1)``,

    s = sigmoid((log u - log(1 - u) + log_alpha) / beta),   z = min(1, max(0, s (zeta - gamma) + gamma)),

so ``z`` is exactly 0 or exactly 1 with positive probability. The expected number of non-zero
gates, the expected L0 norm, has the closed form ``sum_j sigmoid(log_alpha_j - beta log(-gamma/zeta))``
(Eq. 12 of Louizos et al.; the penalty of Eq. 8 of the feature-leveling paper). At test time the
gates are deterministic, ``z = min(1, max(0, sigmoid(log_alpha) (zeta - gamma) + gamma))``; the
leveling networks round this to 0 or 1 (a feature goes deeper iff ``log_alpha >= 0``) so that the
test-time routing is exactly exclusive.

This module holds

* :class:`HardConcreteGate` (sampling, the deterministic test-time value, ``P(z = 0)``,
  ``P(z = 1)`` and the expected L0 penalty, all in closed form);
* :class:`FeatureLevelingNet` (fully connected) and :class:`ConvFeatureLevelingNet` (the
  convolutional variant of Appendix A.11: routed feature maps reach the GLM layer through a linear
  1x1 convolution), with :func:`fcnn` and :func:`cnn` as the plain baselines;
* :func:`prune`: fix the routing gates and remove what no longer computes anything, giving a
  :class:`PrunedLevelingNet` and the architecture string the paper reports ("291-300*-10");
* :func:`fit_leveling`: a training loop for the penalised objective (classification or regression);
* :func:`level_contributions` and :func:`level_gradients`: the GLM layer's output split by feature
  level, and the input gradient of each level's share (Section 5.2);
* :func:`make_ixor`: the paper's IXOR toy data (Section 2.1).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dualview import seed_everything

__all__ = [
    "HardConcreteGate",
    "FeatureLevelingNet",
    "ConvFeatureLevelingNet",
    "PrunedLevelingNet",
    "LevelingHistory",
    "fcnn",
    "cnn",
    "prune",
    "routing_summary",
    "l0_penalty",
    "fit_leveling",
    "evaluate",
    "per_point_scores",
    "level_contributions",
    "level_gradients",
    "make_ixor",
    "ixor_labels_reference",
    "glm_inputs_reference",
    "Routing",
    "ROUTING_RULES",
]

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1
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


class HardConcreteGate(nn.Module):
    """``n`` hard-concrete routing gates with learnable ``log_alpha`` (Louizos et al. 2018, Eq. 9-13).

    In training mode ``forward(batch_shape)`` samples one gate per feature and per sample, shape
    ``(*batch_shape, n)``; in eval mode it returns the deterministic test-time gates (shape ``(n,)``,
    which broadcast). ``init_log_alpha`` sets every gate's starting ``log_alpha``: the default 3
    opens a routing gate with probability ``P(z != 0) = 0.99`` (every feature starts by going deeper).
    """

    def __init__(self, n: int, init_log_alpha: float = 3.0, beta: float = BETA, gamma: float = GAMMA,
                 zeta: float = ZETA) -> None:
        super().__init__()
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"the number of routing gates must be a positive int, got {n!r}")
        if not beta > 0:
            raise ValueError(f"the temperature beta must be positive, got {beta!r}")
        if not (gamma < 0 and zeta > 1):
            raise ValueError(
                f"the stretch interval (gamma, zeta) must contain [0, 1] strictly (gamma < 0 < 1 < zeta), "
                f"so that z = 0 and z = 1 have positive probability; got ({gamma!r}, {zeta!r})"
            )
        self.n, self.beta, self.gamma, self.zeta = int(n), float(beta), float(gamma), float(zeta)
        self.log_alpha = nn.Parameter(torch.full((self.n,), float(init_log_alpha)))

    def extra_repr(self) -> str:
        return f"n={self.n}, beta={self.beta:.3g}, stretch=({self.gamma}, {self.zeta})"

    def sample(self, batch_shape: Sequence[int] = ()) -> Tensor:
        """Draw gates ``z`` of shape ``(*batch_shape, n)`` with the reparameterisation of Eq. 10."""
        la = self.log_alpha
        eps = torch.finfo(la.dtype).eps
        u = torch.rand(*batch_shape, self.n, device=la.device, dtype=la.dtype).clamp(eps, 1 - eps)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + la) / self.beta)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def deterministic(self) -> Tensor:
        """The test-time gates ``min(1, max(0, sigmoid(log_alpha)(zeta - gamma) + gamma))`` (Eq. 13)."""
        return (torch.sigmoid(self.log_alpha) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def prob_zero(self) -> Tensor:
        """``P(z = 0) = sigmoid(beta log(-gamma / zeta) - log_alpha)``, per gate (closed form)."""
        return torch.sigmoid(self.beta * math.log(-self.gamma / self.zeta) - self.log_alpha)

    def prob_one(self) -> Tensor:
        """``P(z = 1) = sigmoid(log_alpha - beta log((1 - gamma) / (zeta - 1)))``, per gate (closed form)."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log((1 - self.gamma) / (self.zeta - 1)))

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
    """The plain baseline: ``Flatten, Linear, ReLU, ..., Linear`` with the same widths as a leveling net."""
    widths = _check_widths(widths, out_features, "fcnn")
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], out_features))
    return nn.Sequential(*layers)


class _Leveling(nn.Module):
    """What the fully connected and convolutional leveling networks share."""

    routing: nn.ModuleList
    rule: str

    def to_glm(self, z: Tensor) -> Tensor:
        """The weight of a feature's copy sent to the GLM layer, given its routing gate ``z``.

        ``rule="binary"`` (Eq. 4 of :cite:`featureleveling2020`): ``B(z) = 1`` iff ``z == 0``, so a
        feature whose gate is strictly positive goes deeper only, even while ``z`` is fractional in
        training. ``rule="complement"``: ``1 - z``. No gradient flows into ``z`` through ``B``.
        """
        if self.rule == "binary":
            return (z == 0).to(z.dtype)
        return 1 - z

    def _check_routing(self, routing: Sequence[Tensor] | None) -> None:
        if routing is None:
            return
        if len(routing) != len(self.routing):
            raise ValueError(f"routing must give one gate tensor per hidden layer ({len(self.routing)}), "
                             f"got {len(routing)}")
        for k, (z, gate) in enumerate(zip(routing, self.routing)):
            if z.shape[-1] != gate.n:
                raise ValueError(f"routing[{k}] must end in {gate.n} gates (one per input feature of hidden "
                                 f"layer {k + 1}), got shape {tuple(z.shape)}")

    def routing_gates(self) -> list[Tensor]:
        """The test-time routing gates of every hidden layer (0 or 1, detached).

        Louizos et al.'s test-time estimate ``z_hat`` (:meth:`HardConcreteGate.deterministic`) rounded:
        a feature goes deeper iff ``z_hat >= 1/2``, that is iff ``log_alpha >= 0``. Rounding makes
        the routing exactly exclusive at test time; after training almost every ``z_hat`` is 0 or 1.
        """
        return [(g.deterministic().detach() >= 0.5).to(g.log_alpha.dtype) for g in self.routing]

    def _gate(self, k: int, h: Tensor, routing: Sequence[Tensor] | None) -> Tensor:
        if routing is not None:
            return routing[k].to(device=h.device, dtype=h.dtype)
        gate = self.routing[k]
        if self.training:
            return gate.sample((h.shape[0],)).to(h.dtype)
        return (gate.deterministic() >= 0.5).to(h.dtype)

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
    gate (``routing_gates``), 0 or 1, so every feature goes one way only.

    ``rule`` says what the GLM layer reads of a feature with routing gate ``z``: ``"binary"`` (default,
    the paper's Eq. 4) ``B(z) h`` with ``B(z) = 1[z == 0]``, so the routing is exclusive in training
    too; ``"complement"`` ``(1 - z) h`` (fractional gates send a feature both ways in training). The
    rules differ only in training: at test time the gates are 0 or 1.
    """

    def __init__(self, widths: Sequence[int], out_features: int, init_log_alpha: float = 3.0,
                 rule: str = "binary") -> None:
        super().__init__()
        self.rule = _check_rule(rule)
        self.widths = _check_widths(widths, out_features, "FeatureLevelingNet")
        self.out_features = int(out_features)
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(self.widths[:-1], self.widths[1:]))
        self.relus = nn.ModuleList(nn.ReLU() for _ in self.hidden)
        self.routing = nn.ModuleList(HardConcreteGate(a, init_log_alpha) for a in self.widths[:-1])
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
        for k, (layer, relu, gate) in enumerate(zip(self.hidden, self.relus, self.routing)):
            z = self._gate(k, h, routing)
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
        self.routing = nn.ModuleList(HardConcreteGate(a, init_log_alpha) for a in widths[:-1])
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
            z = self._gate(k, h, routing)
            z = z[..., None, None]
            parts.append(self.reduce[k](h * self.to_glm(z)).flatten(1))
            h = self.pools[k](self.relus[k](self.hidden[k](h * z)))
        parts.append(h.flatten(1))
        return parts


# --------------------------------------------------------------------------------------------------
# Pruning


class PrunedLevelingNet(nn.Module):
    """A trained :class:`FeatureLevelingNet` with its routing gates fixed and dead weight removed.

    ``deeper_index[k]`` lists the features of ``h_{k}`` that enter hidden layer ``k + 1`` (their
    test-time routing gate is folded into the layer's weights); ``glm_index[k]`` the features routed
    to the GLM layer. Hidden layers that receive no feature at all are gone: their output was a
    constant, which now sits in the GLM layer's bias. :attr:`architecture` is the paper's notation.
    """

    def __init__(self, hidden: list[nn.Linear], deeper_index: list[Tensor], glm_index: list[Tensor],
                 glm: nn.Linear, in_features: int) -> None:
        super().__init__()
        self.hidden = nn.ModuleList(hidden)
        self.relus = nn.ModuleList(nn.ReLU() for _ in hidden)
        self.glm = glm
        self.in_features = in_features
        for k, (d, g) in enumerate(zip(deeper_index, glm_index)):
            self.register_buffer(f"deeper_index_{k}", d)
            self.register_buffer(f"glm_index_{k}", g)

    @property
    def deeper_index(self) -> list[Tensor]:
        return [getattr(self, f"deeper_index_{k}") for k in range(len(self.hidden))]

    @property
    def glm_index(self) -> list[Tensor]:
        return [getattr(self, f"glm_index_{k}") for k in range(len(self.hidden))]

    @property
    def depth(self) -> int:
        """Number of hidden layers left."""
        return len(self.hidden)

    @property
    def architecture(self) -> str:
        """The paper's notation: features entering each remaining layer, then ``width*`` and outputs.

        ``291-300*-10`` reads: 291 inputs enter the first hidden layer (the others go straight to
        the GLM layer), its 300 units all go to the GLM layer (the star marks the concatenation with
        the earlier levels), and there are 10 outputs (Table 1 of :cite:`featureleveling2020`).
        """
        out = self.glm.out_features
        if not self.hidden:
            return f"{self.in_features}*-{out}"
        ins = [str(len(d)) for d in self.deeper_index]
        return "-".join(ins) + f"-{self.hidden[-1].out_features}*-{out}"

    def num_parameters(self, bias: bool = True) -> int:
        """Weights (and biases, with ``bias=True``) of the remaining layers."""
        return sum(p.numel() for name, p in self.named_parameters() if bias or not name.endswith("bias"))

    def glm_inputs(self, x: Tensor) -> list[Tensor]:
        h = x.flatten(1)
        if h.shape[1] != self.in_features:
            raise ValueError(f"expected inputs with {self.in_features} features, got shape {tuple(x.shape)}")
        parts = []
        for layer, relu, d, g in zip(self.hidden, self.relus, self.deeper_index, self.glm_index):
            parts.append(h[:, g])
            h = relu(layer(h[:, d]))
        parts.append(h)
        return parts

    def forward(self, x: Tensor) -> Tensor:
        if not self.hidden:
            return self.glm(x.flatten(1))
        return self.glm(torch.cat(self.glm_inputs(x), 1))


@torch.no_grad()
def prune(model: FeatureLevelingNet) -> PrunedLevelingNet:
    """Fix the test-time routing gates and remove what they switch off (Section 5 of the paper).

    The pruned network computes the same function as ``model`` in eval mode (up to rounding):
    routing gates in ``(0, 1]`` are folded into the next layer's weight columns; features routed to
    the GLM layer keep their GLM weights; the first hidden layer that receives no feature, and every
    layer after it, has a constant output, which is added to the GLM bias.
    """
    if not isinstance(model, FeatureLevelingNet):
        raise TypeError(f"prune expects a FeatureLevelingNet, got {type(model).__name__}")
    zs = model.routing_gates()
    offsets = [0]
    for w in model.widths:
        offsets.append(offsets[-1] + w)
    W, b = model.glm.weight, model.glm.bias
    dev, dt = W.device, W.dtype

    def block(k: int) -> Tensor:  # GLM weights of the k-th GLM input block
        return W[:, offsets[k]:offsets[k + 1]]

    hidden, deeper, to_glm, glm_cols = [], [], [], []
    K = len(model.hidden)
    dead = next((k for k, z in enumerate(zs) if not bool((z > 0).any())), None)
    alive = K if dead is None else dead
    for k in range(alive):
        d = (zs[k] > 0).nonzero().flatten()
        g = (zs[k] == 0).nonzero().flatten()
        lin = nn.Linear(len(d), model.widths[k + 1]).to(device=dev, dtype=dt)
        lin.weight.copy_(model.hidden[k].weight[:, d] * zs[k][d])
        lin.bias.copy_(model.hidden[k].bias)
        hidden.append(lin)
        deeper.append(d)
        to_glm.append(g)
        glm_cols.append(block(k)[:, g])
    bias = b.clone()
    if dead is None:
        glm_cols.append(block(K))
    else:
        # Inputs of layer `dead` all go to the GLM layer (level dead + 1); from there on, constants.
        glm_cols.append(block(dead))
        h = torch.zeros(1, model.widths[dead], device=dev, dtype=dt)
        for k in range(dead, K):
            h = model.relus[k](model.hidden[k](h * zs[k]))
            if k + 1 < K:
                bias += ((h * (zs[k + 1] == 0).to(dt)) @ block(k + 1).T)[0]
        bias += (h @ block(K).T)[0]
    glm = nn.Linear(sum(c.shape[1] for c in glm_cols), model.out_features).to(device=dev, dtype=dt)
    glm.weight.copy_(torch.cat(glm_cols, 1))
    glm.bias.copy_(bias)
    pruned = PrunedLevelingNet(hidden, deeper, to_glm[:alive], glm, model.widths[0])
    return pruned.eval()


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
    """Count, per hidden layer, the features routed deeper and to the GLM layer (test-time gates)."""
    if not isinstance(model, _Leveling):
        raise TypeError(f"routing_summary expects a feature-leveling network, got {type(model).__name__}")
    zs = model.routing_gates()
    deeper = [int((z > 0).sum()) for z in zs]
    depth = next((k for k, n in enumerate(deeper) if n == 0), len(deeper))
    return Routing(deeper, [int((z == 0).sum()) for z in zs], depth)


def l0_penalty(model: nn.Module) -> Tensor:
    """The routing penalty of ``model`` (``FeatureLevelingNet.l0_penalty``); 0 for other networks."""
    if isinstance(model, _Leveling):
        return model.l0_penalty()
    p = next(model.parameters())
    return torch.zeros((), device=p.device, dtype=p.dtype)


# --------------------------------------------------------------------------------------------------
# Training


@dataclass
class LevelingHistory:
    """Per epoch: task loss, penalty, test metric (accuracy or RMSE) and features routed deeper per layer."""

    loss: list[float] = field(default_factory=list)
    penalty: list[float] = field(default_factory=list)
    test_metric: list[float] = field(default_factory=list)
    deeper: list[list[int]] = field(default_factory=list)


_TASKS = ("classification", "regression")


def _xy(data) -> tuple[Tensor, Tensor]:
    if hasattr(data, "x") and hasattr(data, "y"):
        return data.x, data.y
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    raise TypeError("data must be an ImageData (with .x and .y) or a pair (x, y) of tensors")


def _task_loss(out: Tensor, y: Tensor, task: str) -> Tensor:
    if task == "classification":
        return F.cross_entropy(out, y)
    return F.mse_loss(out.reshape(y.shape), y.to(out.dtype))


@torch.no_grad()
def per_point_scores(model: nn.Module, data, task: str = "classification", batch_size: int = 2000) -> Tensor:
    """One score per test point, in eval mode: 1.0/0.0 for a correct/wrong prediction (classification) or
    the squared error (regression). Their mean is :func:`evaluate`'s accuracy (or its RMSE squared); they
    are what :mod:`dualview.stats` bootstraps over."""
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}")
    x, y = _xy(data)
    p = next(model.parameters())
    was = model.training
    model.eval()
    out = torch.cat([model(c.to(device=p.device, dtype=p.dtype)).cpu() for c in x.split(batch_size)])
    model.train(was)
    if task == "classification":
        return (out.argmax(1) == y.cpu()).double()
    return (out.reshape(y.shape).double() - y.cpu().double()).pow(2)


def evaluate(model: nn.Module, data, task: str = "classification", batch_size: int = 2000) -> float:
    """Test accuracy (classification) or root mean squared error (regression), in eval mode: the mean of
    :func:`per_point_scores` (its square root for regression)."""
    mean = per_point_scores(model, data, task, batch_size).mean().item()
    return mean if task == "classification" else mean ** 0.5


def fit_leveling(
    model: nn.Module,
    train,
    epochs: int,
    lam: float = 0.0,
    task: str = "classification",
    lr: float = 1e-3,
    routing_lr: float | None = None,
    batch_size: int = 128,
    test=None,
    weight_decay: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    warmup: int = 0,
    finetune: int = 0,
) -> LevelingHistory:
    """Minimise the task loss plus ``lam`` times the routing penalty (Eq. 8 of the paper) with Adam.

    Works for a :class:`FeatureLevelingNet` / :class:`ConvFeatureLevelingNet` and, with no penalty,
    for any baseline network. ``task``: ``"classification"`` (cross-entropy, integer labels) or
    ``"regression"`` (mean squared error). ``routing_lr`` is the learning rate of the routing
    parameters ``log_alpha`` (default ``lr``). ``warmup``: the penalty grows linearly from 0 to
    ``lam`` over the first ``warmup`` epochs (so hidden layers learn before routes close).
    ``finetune``: after ``epochs`` epochs, train this many more with the routing gates fixed at their
    test-time values (no sampling, no penalty), so the weights fit the final routing. Data are
    reshuffled every epoch with a generator seeded by ``seed``; the model stays on its device and dtype.
    """
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}")
    if epochs < 0 or finetune < 0 or warmup < 0 or batch_size < 1 or lr <= 0 or lam < 0:
        raise ValueError(f"need epochs >= 0, batch_size >= 1, lr > 0 and lam >= 0; got {epochs}, {batch_size}, "
                         f"{lr}, {lam}")
    x, y = _xy(train)
    p0 = next(model.parameters())
    routing = [p for n, p in model.named_parameters() if n.endswith("log_alpha")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("log_alpha")]
    groups = [{"params": rest, "weight_decay": weight_decay}]
    if routing:
        groups.append({"params": routing, "lr": routing_lr or lr, "weight_decay": 0.0})
    opt = torch.optim.Adam(groups, lr=lr)
    gen = seed_everything(seed)
    hist = LevelingHistory()
    leveled = isinstance(model, _Leveling)
    bar = tqdm(range(epochs + finetune * leveled), desc="epochs", disable=not progress, leave=False)
    for epoch in bar:
        model.train()
        lam_now = lam * min(1.0, epoch / warmup) if warmup > 0 else lam
        fixed = model.routing_gates() if leveled and epoch >= epochs else None
        perm = torch.randperm(len(y), generator=gen)
        total, pen_total = 0.0, 0.0
        for idx in perm.split(batch_size):
            xb = x[idx].to(device=p0.device, dtype=p0.dtype)
            yb = y[idx].to(p0.device)
            loss = _task_loss(model(xb) if fixed is None else model(xb, routing=fixed), yb, task)
            pen = l0_penalty(model)
            opt.zero_grad(set_to_none=True)
            (loss if fixed is not None else loss + lam_now * pen).backward()
            opt.step()
            total += loss.item() * len(idx)
            pen_total += pen.item() * len(idx)
        hist.loss.append(total / len(y))
        hist.penalty.append(pen_total / len(y))
        if isinstance(model, _Leveling):
            hist.deeper.append(routing_summary(model).deeper)
        if test is not None:
            hist.test_metric.append(evaluate(model, test, task))
        bar.set_postfix(loss=f"{hist.loss[-1]:.3f}")
    model.eval()
    return hist


# --------------------------------------------------------------------------------------------------
# Reading the GLM layer by level


def _glm_blocks(model: nn.Module, x: Tensor) -> tuple[list[Tensor], Tensor]:
    if not (hasattr(model, "glm_inputs") and isinstance(getattr(model, "glm", None), nn.Linear)):
        raise TypeError(f"expected a feature-leveling network (FeatureLevelingNet, ConvFeatureLevelingNet or "
                        f"PrunedLevelingNet), got {type(model).__name__}")
    if isinstance(model, PrunedLevelingNet) and not model.hidden:
        parts = [x.flatten(1)]
    else:
        parts = model.glm_inputs(x)
    W = model.glm.weight
    blocks = torch.split(W, [p.shape[1] for p in parts], dim=1)
    return [p @ w.T for p, w in zip(parts, blocks)], model.glm.bias


def level_contributions(model: nn.Module, x: Tensor) -> Tensor:
    """The GLM layer's output split by feature level, ``(N, L, out)``, in the model's current mode.

    Entry ``[:, l]`` is ``W_l l_l(x)``, the GLM weights of level ``l + 1`` times the level-``(l + 1)``
    features (the last entry reads the last hidden layer). The output is the sum over levels plus
    the GLM bias: the network is a GLM in its levels (Appendix A.3 of :cite:`featureleveling2020`).
    """
    contribs, _ = _glm_blocks(model, x)
    return torch.stack(contribs, 1)


def level_gradients(model: nn.Module, x: Tensor, target: int | Tensor) -> Tensor:
    """Input gradient of each level's contribution to output ``target``, ``(N, L, *x.shape[1:])``.

    This is the per-level saliency of Section 5.2 of :cite:`featureleveling2020`. The levels'
    gradients add up to the gradient of the output itself. ``target``: one output index, or one per
    sample (``(N,)``). Call it with the model in eval mode (fixed routing gates).
    """
    n_out = model.glm.out_features
    target = torch.as_tensor(target, device=x.device)
    if target.dim() == 0:
        target = target.expand(len(x))
    if target.shape != (len(x),) or target.min() < 0 or target.max() >= n_out:
        raise ValueError(f"target must be an int or an (N,) tensor of indices in [0, {n_out}), got {target!r}")
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        contribs, _ = _glm_blocks(model, x)
        grads = []
        for k, c in enumerate(contribs):
            sel = c.gather(1, target[:, None]).sum()
            g, = torch.autograd.grad(sel, x, retain_graph=k + 1 < len(contribs), allow_unused=True)
            grads.append(torch.zeros_like(x) if g is None else g)
    return torch.stack(grads, 1)


# --------------------------------------------------------------------------------------------------
# IXOR


def make_ixor(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """IXOR (Section 2.1 of :cite:`featureleveling2020`): ``n`` samples ``(x, y)``.

    ``x1, x2 ~ U[-2, 2]``, ``x3 ~ U[0, 1]`` independently; ``y = 1`` iff ``x1 x2 > 0`` and
    ``x3 > 0.5``, else 0 (int64). Seeded with its own generator.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    g = torch.Generator().manual_seed(int(seed))
    u = torch.rand(int(n), 3, generator=g, dtype=torch.float64)
    x = torch.stack([4 * u[:, 0] - 2, 4 * u[:, 1] - 2, u[:, 2]], 1)
    y = ((x[:, 0] * x[:, 1] > 0) & (x[:, 2] > 0.5)).long()
    return x.to(dtype), y


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


def ixor_labels_reference(x: Tensor) -> Tensor:
    """IXOR labels of given points, one sample at a time (slow reference for :func:`make_ixor`)."""
    labels = []
    for x1, x2, x3 in x.double().tolist():
        labels.append(1 if (x1 * x2 > 0 and x3 > 0.5) else 0)
    return torch.tensor(labels, dtype=torch.int64)
