"""The networks of the papers' experiments, as Caffe defines them (BVLC reference models), and
ResNet-20 (He et al. 2016, §4.2), a graph net with residual sums and batch normalisation.

Each takes the per-image input shape and the number of classes, so the same architecture serves
small stand-in data (e.g. 8×8 digits padded to 28×28) and the real datasets.
"""

from __future__ import annotations

from collections.abc import Callable

from dasknn.nn.layers import LRN, Convolution, Dropout, Filler, InnerProduct, Pooling, ReLU
from dasknn.nn.merge import Eltwise
from dasknn.nn.net import Net
from dasknn.nn.normalization import BatchNorm, Scale


def _conv(name, n, k, std=None, pad=0, stride=1, group=1, bias=0.0, decay=(1.0, 1.0)):
    wf = Filler("gaussian", std=std) if std is not None else Filler("xavier")
    return Convolution(
        name,
        n,
        k,
        stride=stride,
        pad=pad,
        group=group,
        weight_filler=wf,
        bias_filler=Filler("constant", value=bias),
        lr_mult=(1.0, 2.0),
        decay_mult=decay,
    )


def _ip(name, n, std=None, bias=0.0, decay=(1.0, 1.0)):
    wf = Filler("gaussian", std=std) if std is not None else Filler("xavier")
    return InnerProduct(
        name,
        n,
        weight_filler=wf,
        bias_filler=Filler("constant", value=bias),
        lr_mult=(1.0, 2.0),
        decay_mult=decay,
    )


def lenet(
    input_shape: tuple[int, int, int] = (1, 28, 28),
    num_classes: int = 10,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """Caffe's MNIST LeNet (examples/mnist/lenet_train_test.prototxt): 2 conv, 2 max-pool, 2 FC."""
    layers = [
        _conv("conv1", 20, 5),
        Pooling("pool1", "max", 2, stride=2),
        _conv("conv2", 50, 5),
        Pooling("pool2", "max", 2, stride=2),
        _ip("ip1", 500),
        ReLU("relu1"),
        _ip("ip2", num_classes),
    ]
    return Net(layers, input_shape, name="LeNet", seed=seed, backend=backend)


def cifar10_quick(
    input_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """Caffe's CIFAR-10 quick net (examples/cifar10/cifar10_quick_train_test.prototxt)."""
    layers = [
        _conv("conv1", 32, 5, std=0.0001, pad=2),
        Pooling("pool1", "max", 3, stride=2),
        ReLU("relu1"),
        _conv("conv2", 32, 5, std=0.01, pad=2),
        ReLU("relu2"),
        Pooling("pool2", "ave", 3, stride=2),
        _conv("conv3", 64, 5, std=0.01, pad=2),
        ReLU("relu3"),
        Pooling("pool3", "ave", 3, stride=2),
        _ip("ip1", 64, std=0.1),
        _ip("ip2", num_classes, std=0.1),
    ]
    return Net(layers, input_shape, name="CIFAR10_quick", seed=seed, backend=backend)


def cifar10_full(
    input_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """Caffe's CIFAR-10 full net (examples/cifar10/cifar10_full_train_test.prototxt), with
    within-channel LRN after the first two pooling layers."""

    def norm(name):
        return LRN(name, local_size=3, alpha=5e-05, beta=0.75, norm_region="within_channel")

    layers = [
        _conv("conv1", 32, 5, std=0.0001, pad=2),
        Pooling("pool1", "max", 3, stride=2),
        ReLU("relu1"),
        norm("norm1"),
        _conv("conv2", 32, 5, std=0.01, pad=2),
        ReLU("relu2"),
        Pooling("pool2", "ave", 3, stride=2),
        norm("norm2"),
        _conv("conv3", 64, 5, std=0.01, pad=2),
        ReLU("relu3"),
        Pooling("pool3", "ave", 3, stride=2),
        _ip("ip1", num_classes, std=0.01, decay=(250.0, 0.0)),
    ]
    return Net(layers, input_shape, name="CIFAR10_full", seed=seed, backend=backend)


def caffenet(
    input_shape: tuple[int, int, int] = (3, 227, 227),
    num_classes: int = 1000,
    groups: int = 2,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """BVLC reference CaffeNet (AlexNet with pooling before normalisation).

    `groups=2` is Caffe's two-tower split of conv2, conv4, conv5; `groups=1` is the single-tower
    variant that the Omnivore experiments allow.
    """
    if groups not in (1, 2):
        raise ValueError(f"groups must be 1 or 2, got {groups}")
    d = (1.0, 0.0)

    def lrn(name):
        return LRN(name, local_size=5, alpha=0.0001, beta=0.75)

    layers = [
        _conv("conv1", 96, 11, std=0.01, stride=4, decay=d),
        ReLU("relu1"),
        Pooling("pool1", "max", 3, stride=2),
        lrn("norm1"),
        _conv("conv2", 256, 5, std=0.01, pad=2, group=groups, bias=1.0, decay=d),
        ReLU("relu2"),
        Pooling("pool2", "max", 3, stride=2),
        lrn("norm2"),
        _conv("conv3", 384, 3, std=0.01, pad=1, decay=d),
        ReLU("relu3"),
        _conv("conv4", 384, 3, std=0.01, pad=1, group=groups, bias=1.0, decay=d),
        ReLU("relu4"),
        _conv("conv5", 256, 3, std=0.01, pad=1, group=groups, bias=1.0, decay=d),
        ReLU("relu5"),
        Pooling("pool5", "max", 3, stride=2),
        _ip("fc6", 4096, std=0.005, bias=1.0, decay=d),
        ReLU("relu6"),
        Dropout("drop6", 0.5),
        _ip("fc7", 4096, std=0.005, bias=1.0, decay=d),
        ReLU("relu7"),
        Dropout("drop7", 0.5),
        _ip("fc8", num_classes, std=0.01, decay=d),
    ]
    return Net(layers, input_shape, name="CaffeNet", seed=seed, backend=backend)


def mlp(
    input_shape: tuple[int, int, int] = (64, 1, 1),
    num_classes: int = 10,
    hidden: int = 64,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """A two-layer perceptron written as a CNN: a 1×1 convolution over the features (the conv phase)
    and an InnerProduct classifier (the FC phase). For tabular or flattened data seen as 1×1 images."""
    layers = [
        _conv("conv1", hidden, 1),
        ReLU("relu1"),
        _ip("ip1", num_classes),
    ]
    return Net(layers, input_shape, name="MLP", seed=seed, backend=backend)


def residual_block(name: str, bottom: str, n_in: int, n_out: int, stride: int) -> tuple[list, str]:
    """One basic residual block of He et al. 2016 (§3.3, Fig. 2) in Caffe's layers: two 3×3
    convolutions, each followed by BatchNorm + Scale, the first by ReLU; the shortcut is the identity,
    or a 1×1 convolution + BatchNorm + Scale where the shape changes (option B, §3.3); Eltwise SUM,
    then ReLU. Returns ((layer, bottom, top) entries, the top blob)."""

    def conv_bn(tag, src, n, k, s):
        conv = Convolution(
            f"{name}/{tag}",
            n,
            k,
            stride=s,
            pad=k // 2,
            bias_term=False,
            weight_filler=Filler("msra"),
        )
        return [
            (conv, src, f"{name}/{tag}"),
            (BatchNorm(f"{name}/{tag}/bn", moving_average_fraction=0.9), f"{name}/{tag}", f"{name}/{tag}"),
            (Scale(f"{name}/{tag}/scale"), f"{name}/{tag}", f"{name}/{tag}"),
        ]

    entries = conv_bn("conv1", bottom, n_out, 3, stride)
    entries.append((ReLU(f"{name}/relu1"), f"{name}/conv1", f"{name}/conv1"))
    entries += conv_bn("conv2", f"{name}/conv1", n_out, 3, 1)
    shortcut = bottom
    if stride != 1 or n_in != n_out:
        entries += conv_bn("proj", bottom, n_out, 1, stride)
        shortcut = f"{name}/proj"
    entries.append((Eltwise(f"{name}/sum"), [f"{name}/conv2", shortcut], name))
    entries.append((ReLU(f"{name}/relu"), name, name))
    return entries, name


def resnet20(
    input_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    seed: int = 0,
    n: int = 3,
    backend: str = "auto",
) -> Net:
    """ResNet-20 for CIFAR-sized input (He et al. 2016, §4.2): a 3×3 convolution with 16 filters,
    three stages of `n` = 3 residual blocks with 16, 32 and 64 filters (stride 2 entering stages 2
    and 3), global average pooling and an InnerProduct classifier: 6n + 2 = 20 weighted layers.
    The shortcuts that change shape are 1×1 projections (option B), which Caffe's layers express."""
    entries = [
        (Convolution("conv1", 16, 3, pad=1, bias_term=False, weight_filler=Filler("msra")), "data", "conv1"),
        (BatchNorm("conv1/bn", moving_average_fraction=0.9), "conv1", "conv1"),
        (Scale("conv1/scale"), "conv1", "conv1"),
        (ReLU("conv1/relu"), "conv1", "conv1"),
    ]
    blob, width = "conv1", 16
    for stage, n_out in enumerate((16, 32, 64), 1):
        for block in range(1, n + 1):
            stride = 2 if stage > 1 and block == 1 else 1
            more, blob = residual_block(f"res{stage}.{block}", blob, width, n_out, stride)
            entries += more
            width = n_out
    entries += [
        (Pooling("pool", "ave", global_pooling=True), blob, "pool"),
        (_ip("fc", num_classes), "pool", "fc"),
    ]
    return Net(
        entries,
        input_shape,
        name="ResNet-20" if n == 3 else f"ResNet-{6 * n + 2}",
        seed=seed,
        backend=backend,
    )


NETS: dict[str, Callable[..., Net]] = {
    "mlp": mlp,
    "lenet": lenet,
    "cifar10_quick": cifar10_quick,
    "cifar10_full": cifar10_full,
    "caffenet": caffenet,
    "resnet20": resnet20,
}


def get_net(
    name: str,
    input_shape: tuple[int, int, int] | None = None,
    num_classes: int = 10,
    seed: int = 0,
    backend: str = "auto",
) -> Net:
    """A zoo net by name ("lenet", "cifar10_quick", "cifar10_full", "caffenet", "mlp", "resnet20")."""
    key = name.lower().replace("-", "_")
    if key not in NETS:
        raise ValueError(f"unknown net {name!r}; available: {sorted(NETS)}")
    kwargs = {"num_classes": num_classes, "seed": seed, "backend": backend}
    if input_shape is not None:
        kwargs["input_shape"] = tuple(input_shape)
    return NETS[key](**kwargs)
