"""A trained feature-leveling network read by level: pruned to what computes, and split by level.

After training, the routing gates of a :class:`~dualview.leveling.FeatureLevelingNet` are fixed (0 or
1). :func:`prune` removes what they switch off, giving a :class:`PrunedLevelingNet` with the same
test-time function and the architecture string the paper reports ("291-300*-10", Section 5 and
Table 1 of :cite:`featureleveling2020`). The GLM layer is then a GLM in the feature levels (Appendix
A.3): :func:`level_contributions` splits its output by level, and :func:`level_gradients` gives the
input gradient of each level's share (Section 5.2).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from dualview.leveling import FeatureLevelingNet

__all__ = ["PrunedLevelingNet", "prune", "level_contributions", "level_gradients"]


class PrunedLevelingNet(nn.Module):
    """A trained :class:`~dualview.leveling.FeatureLevelingNet` with its routing gates fixed and dead weight removed.

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


# --------------------------------------------------------------------------------------------------
# Reading the GLM layer by level


def _level_terms(model: nn.Module, x: Tensor) -> list[Tensor]:
    """``W_l l_l(x)`` for every level ``l``: the GLM weights of each input block times that block."""
    if not (hasattr(model, "glm_inputs") and isinstance(getattr(model, "glm", None), nn.Linear)):
        raise TypeError(f"expected a feature-leveling network (FeatureLevelingNet, ConvFeatureLevelingNet or "
                        f"PrunedLevelingNet), got {type(model).__name__}")
    parts = model.glm_inputs(x)
    blocks = torch.split(model.glm.weight, [p.shape[1] for p in parts], dim=1)
    return [p @ w.T for p, w in zip(parts, blocks)]


def level_contributions(model: nn.Module, x: Tensor) -> Tensor:
    """The GLM layer's output split by feature level, ``(N, L, out)``, in the model's current mode.

    Entry ``[:, l]`` is ``W_l l_l(x)``, the GLM weights of level ``l + 1`` times the level-``(l + 1)``
    features (the last entry reads the last hidden layer). The output is the sum over levels plus
    the GLM bias: the network is a GLM in its levels (Appendix A.3 of :cite:`featureleveling2020`).
    """
    return torch.stack(_level_terms(model, x), 1)


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
        contribs = _level_terms(model, x)
        grads = []
        for k, c in enumerate(contribs):
            sel = c.gather(1, target[:, None]).sum()
            g, = torch.autograd.grad(sel, x, retain_graph=k + 1 < len(contribs), allow_unused=True)
            grads.append(torch.zeros_like(x) if g is None else g)
    return torch.stack(grads, 1)
