"""The plain ReLU networks of the book: architectures only, no weights and no downloads.

Every network here is an ``nn.Module`` in which each ReLU is its own ``nn.ReLU()`` instance, used
exactly once in ``forward`` (no ``F.relu``, no shared or in-place ReLU), so that :mod:`dualview.gates`
records every gate:

* the networks of the pretrained weights (:mod:`dualview.zoo`): :func:`mnist_cnn` (20-50-500),
  :func:`lenet5`, :func:`advertorch_lenet5`, and the CIFAR ResNets (:class:`CifarResNet`,
  :class:`BasicBlock`, option-A shortcut :class:`ShortcutA`);
* :func:`relu_mlp`, the fully connected ReLU network; :func:`two_conv`, the 2CONV of the
  switched-projections paper :cite:`szymanski2020switched`;
* the networks of the kernel theorems of :cite:`lakshminarayanan2022explicitising`:
  :func:`circular_convnet` (Theorem 3.2) and :class:`FCResNet` (Theorem 3.3);
* affine helper layers (:class:`Normalize`, :class:`Resize`).

Layer support is declared by the classes themselves: ``linear_layer = True`` makes a class a linear
layer for :mod:`dualview.gates`, ``pointwise = True`` tells :func:`dualview.projections.insens` that
each output pixel reads only its own input pixel, and a ``unit_weights()`` method gives the layer's
unit-weight version to :func:`dualview.paths.count_paths`.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Normalize",
    "Resize",
    "ShortcutA",
    "mnist_cnn",
    "lenet5",
    "advertorch_lenet5",
    "two_conv",
    "BasicBlock",
    "CifarResNet",
    "cifar_resnet",
    "relu_mlp",
    "circular_convnet",
    "FCResNet",
    "fc_resnet",
]


# --------------------------------------------------------------------------------------------------
# Affine helper layers


class Normalize(nn.Module):
    """Per-channel affine map ``(x - mean) / std`` on ``(N, C, H, W)`` inputs."""

    linear_layer = True  # affine: supported by dualview.gates like a Linear layer
    pointwise = True  # each output pixel reads only the same input pixel (receptive fields, projections.insens)

    def unit_weights(self) -> nn.Module:
        """Its unit-weight version for counting paths: one edge of weight 1 per pixel."""
        return nn.Identity()

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        std_t = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        if mean_t.numel() != std_t.numel() or not bool((std_t > 0).all()):
            raise ValueError(f"mean and std need the same length and std > 0, got {mean!r}, {std!r}")
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class Resize(nn.Module):
    """Bilinear resize (``align_corners=False``), e.g. 28x28 MNIST to the 32x32 input of LeNet-5."""

    linear_layer = True

    def __init__(self, size: int | tuple[int, int]) -> None:
        super().__init__()
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)

    def unit_weights(self) -> nn.Module:
        """Its unit-weight version for counting paths (see :class:`_ResizeConnectivity`)."""
        return _ResizeConnectivity(self)

    def extra_repr(self) -> str:
        return f"size={self.size}"


class ShortcutA(nn.Module):
    """The "option A" CIFAR ResNet shortcut: subsample ``x[:, :, ::2, ::2]``, zero-pad channels.

    ``planes // 4`` zero channels go on each side, so 16 -> 32 and 32 -> 64 channels (He et al. 2016).
    """

    linear_layer = True

    def __init__(self, planes: int) -> None:
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))

    def unit_weights(self) -> nn.Module:
        """A fixed selection of inputs: its edges have weight 1 already."""
        return self

    def extra_repr(self) -> str:
        return f"pad={self.pad}"


class _ResizeConnectivity(nn.Module):
    """Unit-weight version of :class:`Resize` for path counting: each output pixel sums, with weight 1,
    the input pixels its bilinear interpolation reads (those with a non-zero interpolation weight)."""

    linear_layer = True

    def __init__(self, resize: Resize) -> None:
        super().__init__()
        self.size = resize.size

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        basis = torch.eye(h * w, dtype=x.dtype, device=x.device).view(h * w, 1, h, w)
        reads = F.interpolate(basis, size=self.size, mode="bilinear", align_corners=False) != 0
        conn = reads.flatten(1).to(x.dtype)  # (h*w inputs, H*W outputs)
        return (x.reshape(n * c, h * w) @ conn).view(n, c, *self.size)


# --------------------------------------------------------------------------------------------------
# Architectures (module names match the published state dicts)


def mnist_cnn() -> nn.Sequential:
    """conv 1->20 5x5, ReLU, maxpool 2, conv 20->50 5x5, ReLU, maxpool 2, fc 800->500, ReLU, fc 500->10.

    The layer pattern of the "2CONV" network of the switched-projections paper, but smaller (the 2CONV
    has 32 and 64 filters and 512 hidden units); 28x28 input.
    """
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 20, 5), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(20, 50, 5), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), fc1=nn.Linear(800, 500), relu3=nn.ReLU(), fc2=nn.Linear(500, 10),
    ))


def lenet5() -> nn.Sequential:
    """LeNet-5 with ReLUs and max pools on a 32x32 input: c1 1->6, c3 6->16, c5 16->120 (5x5), f6, f7.

    The original ends in a LogSoftmax; we return the logits (same argmax).
    """
    return nn.Sequential(OrderedDict(
        convnet=nn.Sequential(OrderedDict(
            c1=nn.Conv2d(1, 6, 5), relu1=nn.ReLU(), s2=nn.MaxPool2d(2),
            c3=nn.Conv2d(6, 16, 5), relu3=nn.ReLU(), s4=nn.MaxPool2d(2),
            c5=nn.Conv2d(16, 120, 5), relu5=nn.ReLU(),
        )),
        flatten=nn.Flatten(),
        fc=nn.Sequential(OrderedDict(f6=nn.Linear(120, 84), relu6=nn.ReLU(), f7=nn.Linear(84, 10))),
    ))


def advertorch_lenet5() -> nn.Sequential:
    """advertorch's MNIST LeNet5: conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64, ReLU, maxpool 2,
    linear 3136->200, ReLU, linear 200->10; 28x28 input in [0, 1]."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 32, 3, padding=1), relu1=nn.ReLU(), maxpool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(32, 64, 3, padding=1), relu2=nn.ReLU(), maxpool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), linear1=nn.Linear(7 * 7 * 64, 200), relu3=nn.ReLU(), linear2=nn.Linear(200, 10),
    ))


def two_conv(in_channels: int = 1, size: int = 28, num_classes: int = 10) -> nn.Sequential:
    """The 2CONV network of Table 1 of :cite:`szymanski2020switched`: two "same"-padded 5x5 convolutions
    with 32 and 64 filters, each followed by ReLU and 2x2 max-pooling, a fully connected layer of 512
    units and the output layer; a ``size x size`` input (``size`` divisible by 4)."""
    if size < 4 or size % 4:
        raise ValueError(f"size must be a positive multiple of 4 (two 2x2 max-pools), got {size}")
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 32, 5, padding=2), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(32, 64, 5, padding=2), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), fc1=nn.Linear(64 * (size // 4) ** 2, 512), relu3=nn.ReLU(),
        fc2=nn.Linear(512, num_classes),
    ))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU (two separate ReLU modules)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        changes_shape = stride != 1 or in_planes != planes
        self.shortcut = ShortcutA(planes) if changes_shape else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of He et al. (2016), depth ``6n + 2``: three stages of ``n`` blocks with 16,
    32 and 64 channels, option-A shortcuts, global average pooling and a ``linear`` head.

    Parameter names match akamaster/pytorch_resnet_cifar10 (without its ``module.`` prefix).
    """

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(
                f"depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...); got {depth!r}"
            )
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = self._stage(16, 16, n, stride=1)
        self.layer2 = self._stage(16, 32, n, stride=2)
        self.layer3 = self._stage(32, 64, n, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(64, num_classes)

    @staticmethod
    def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            BasicBlock(in_planes, planes, stride), *(BasicBlock(planes, planes) for _ in range(blocks - 1))
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(self.flatten(self.pool(out)))


def cifar_resnet(depth: int, num_classes: int = 10) -> CifarResNet:
    """A CIFAR ResNet of depth ``6n + 2`` (20, 32, 44, 56, 110, ...); see :class:`CifarResNet`."""
    return CifarResNet(depth, num_classes)


# --------------------------------------------------------------------------------------------------
# The networks of the kernel theorems: circular convolutions (Theorem 3.2), residual blocks (Theorem 3.3)


def circular_convnet(in_channels: int, channels: Sequence[int], fc_widths: Sequence[int] = (),
                     num_outputs: int = 10, kernel_size: int = 3, dims: Literal[1, 2] = 1,
                     head: Literal["gap", "flatten"] = "gap", spatial: int | tuple[int, ...] | None = None,
                     ) -> nn.Sequential:
    """The convolutional network of Appendix F of :cite:`lakshminarayanan2022explicitising`, without biases.

    Circular, stride-1, same-size convolutions (``Conv1d`` or ``Conv2d`` by ``dims``) of ``channels``
    filters, each followed by a ReLU; then ``head``: ``"gap"`` (global average pooling, the setting of
    Theorem 3.2) or ``"flatten"`` (every position gets weights of its own, which breaks the rotation
    invariance; needs ``spatial``, the input's length or ``(H, W)``); then fully connected ReLU layers
    of ``fc_widths`` and a linear output layer of ``num_outputs`` units.
    """
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 (signals) or 2 (images), got {dims!r}")
    if not channels or any(c < 1 for c in channels) or any(w < 1 for w in fc_widths):
        raise ValueError(f"channels and fc_widths must be positive, got {tuple(channels)} and {tuple(fc_widths)}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (same-size convolutions), got {kernel_size}")
    if head not in ("gap", "flatten"):
        raise ValueError(f"head must be 'gap' or 'flatten', got {head!r}")
    conv = nn.Conv1d if dims == 1 else nn.Conv2d
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    prev = in_channels
    for i, c in enumerate(channels, 1):
        layers[f"conv{i}"] = conv(prev, c, kernel_size, padding=kernel_size // 2, padding_mode="circular",
                                  bias=False)
        layers[f"relu{i}"] = nn.ReLU()
        prev = c
    if head == "gap":
        layers["gap"] = nn.AdaptiveAvgPool1d(1) if dims == 1 else nn.AdaptiveAvgPool2d(1)
    elif spatial is None:
        raise ValueError("head='flatten' needs spatial, the input's length (dims=1) or (H, W) (dims=2)")
    else:
        size = (spatial,) * dims if isinstance(spatial, int) else tuple(spatial)
        if len(size) != dims:
            raise ValueError(f"spatial must have {dims} entries for dims={dims}, got {spatial!r}")
        prev *= math.prod(size)
    layers["flatten"] = nn.Flatten()
    for j, w in enumerate(fc_widths, 1):
        layers[f"fc{j}"] = nn.Linear(prev, w, bias=False)
        layers[f"fc_relu{j}"] = nn.ReLU()
        prev = w
    layers["out"] = nn.Linear(prev, num_outputs, bias=False)
    return nn.Sequential(layers)


def relu_mlp(widths: Sequence[int], bias: bool = True, output_relu: bool = False) -> nn.Sequential:
    """A fully connected ReLU network ``Sequential(Linear, ReLU, ..., Linear)`` with layer sizes
    ``widths = [d_in, w_1, ..., d_out]``, one ``nn.ReLU`` instance per hidden layer (a ReLU after the
    last layer too with ``output_relu``). Float32; call ``.double()`` for exact checks."""
    if len(widths) < 2 or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"widths must list at least two positive ints [d_in, ..., d_out], got {list(widths)}")
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if output_relu or k < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class FCResNet(nn.Module):
    """The residual network of Theorem 3.3 of :cite:`lakshminarayanan2022explicitising` (Appendix G).

    ``b + 2`` fully connected blocks of ``d_blk`` bias-free layers of width ``w``: the block
    ``first`` (``d_in -> w``, ReLUs), ``b`` residual blocks (``h <- h + block(h)``, each
    ``d_blk`` Linear-ReLU layers) and the block ``last`` (``d_blk - 1`` Linear-ReLU layers, then a
    linear output layer). A path either enters a residual block or takes its skip connection, so the
    network holds ``2^b`` fully connected sub-networks; the one through the blocks ``J`` has
    ``(|J| + 2) d_blk`` layers.
    """

    def __init__(self, d_in: int, width: int, d_blk: int, b: int, num_outputs: int = 1) -> None:
        super().__init__()
        for name, value, low in (("d_in", d_in, 1), ("width", width, 1), ("d_blk", d_blk, 1), ("b", b, 0),
                                 ("num_outputs", num_outputs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.d_in, self.width, self.d_blk, self.b, self.num_outputs = d_in, width, d_blk, b, num_outputs
        self.first = relu_mlp([d_in] + [width] * d_blk, bias=False, output_relu=True)
        self.blocks = nn.ModuleList(relu_mlp([width] * (d_blk + 1), bias=False, output_relu=True) for _ in range(b))
        self.last = relu_mlp([width] * d_blk + [num_outputs], bias=False)

    def forward(self, x: Tensor, skip: Sequence[int] = ()) -> Tensor:
        """The output; ``skip`` lists residual blocks (0-based) to delete, leaving their skip connection only."""
        h = self.first(x.flatten(1))
        for j, block in enumerate(self.blocks):
            if j not in skip:
                h = h + block(h)
        return self.last(h)

    def subnetwork(self, subset: Sequence[int]) -> list[nn.Linear]:
        """The Linear layers of the sub-network through the residual blocks ``subset`` (0-based), in order."""
        bad = [j for j in subset if not 0 <= j < self.b]
        if bad:
            raise ValueError(f"blocks {bad} do not exist: this ResNet has residual blocks 0..{self.b - 1}")
        parts = [self.first, *(self.blocks[j] for j in sorted(set(subset))), self.last]
        return [m for part in parts for m in part if isinstance(m, nn.Linear)]


def fc_resnet(d_in: int, width: int, d_blk: int, b: int, num_outputs: int = 1) -> FCResNet:
    """A :class:`FCResNet`: ``b`` residual blocks between a first and a last block, each ``d_blk`` layers deep."""
    return FCResNet(d_in, width, d_blk, b, num_outputs)
