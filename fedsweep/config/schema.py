"""Typed, validated run configuration.

A run config is YAML in, a :class:`RunConfig` out. Every option is documented in its field
description (``fedsweep config --help`` style docs are generated from them, see docs/config.md).
Bad input raises :class:`ConfigError` with one line that names the dotted key and what is allowed.

η_l is ``local.lr``, η_g is ``server.lr``, ρ is ``heterogeneity.rho``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedsweep.util.errors import ConfigError  # re-exported: `from fedsweep.config.schema import ConfigError` works
from fedsweep.config.registry import get_algorithm_class
from fedsweep.config.components import DataConfig, ModelConfig, PartitionConfig  # noqa: F401  (re-exported)
from fedsweep.config.checks import check_client_evaluation, check_local_work, check_validation_clients
from fedsweep.config.yamlfile import DuplicateKey, UniqueKeyLoader, parse_yaml


class _Strict(BaseModel):
    # allow_inf_nan=False: no option here has a meaning at inf or nan, so `local.lr=inf` is refused by key
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LocalConfig(_Strict):
    steps: int = Field(5, ge=1, description="E: local work per round, in `unit`s.")
    unit: Literal["steps", "epochs"] = Field(
        "steps", description="`steps`: E mini-batch SGD steps (the FedLGA paper's 'epochs'); "
        "`epochs`: E passes over the client's data.")
    batch_size: int = Field(10, ge=1, description="B, the mini-batch size.")
    lr: float = Field(0.05, gt=0, description="η_l, the local learning rate at round 0.")
    lr_decay: float = Field(1.0, gt=0, le=1, description="η_l at round t is max(lr·lr_decay^t, lr_min).")
    lr_min: float = Field(0.0, ge=0, description="Floor of the decayed local learning rate.")


class HeterogeneityConfig(_Strict):
    kind: Literal["none", "stragglers", "uniform", "profiles"] = Field(
        "none", description="Who completes how much local work (docs/design.md §2.3).")
    rho: float = Field(
        0.0, ge=0, le=1, description="`stragglers`: ρ, the share of sampled clients that are stragglers "
        "(exactly round(ρK) of them).")
    tau_max: int | None = Field(
        None, ge=1, description="`stragglers`: τ_max; a straggler completes E_i ~ U{E−τ_max..E−1}. "
        "Default E−1.")
    min_steps: int = Field(1, ge=1, description="`uniform`: E_min.")
    max_steps: int | None = Field(None, ge=1, description="`uniform`: E_max (default E).")
    deadline: float | None = Field(
        None, gt=0, description="`profiles`: round deadline D in time units; E_i = clip(floor(s_i·D), 1, E). "
        "Default E, so a client of median speed finishes.")
    speeds: float = Field(
        0.5, ge=0, description="`profiles`: σ of the lognormal client speeds s_i (median 1 unit of work "
        "per unit of time); ignored when `trace` is given.")
    trace: str | None = Field(
        None, description="`profiles`: CSV of per-client speeds (a `speed` column, or one number per line), "
        "cycled if shorter than N.")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="`profiles`: probability that a sampled client returns nothing.")


class AlgorithmConfig(BaseModel):
    """`name` picks the algorithm; the other keys are that algorithm's own parameters.

    Each algorithm declares them as a pydantic model (``Algorithm.Params``); they are validated
    against it, so a key that algorithm does not know is an error naming the key.
    """
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = Field("fedavg", description="Algorithm name (see `fedsweep algorithms`).")
    weighting: Literal["uniform", "data"] = Field(
        "uniform", description="Aggregation weights q_i: `uniform` 1/K (the papers) or `data` n_i/Σn.")

    @model_validator(mode="after")
    def _check_params(self) -> "AlgorithmConfig":
        cls = get_algorithm_class(self.name)  # raises ConfigError naming algorithm.name
        extra = dict(self.model_extra or {})
        try:
            params = _finite_params(cls.Params)(**extra)
        except ValidationError as e:
            err = e.errors()[0]
            if err["type"] == "extra_forbidden":
                # the common keys (name, weighting) and this algorithm's own; the key may belong to another
                own, common = list(cls.Params.model_fields), ", ".join(type(self).model_fields)
                allowed = (f"{self.name} takes no parameters (allowed: {common})" if not own else
                           f"allowed for {self.name}: {common}, {', '.join(own)}")
                key = ".".join(str(p) for p in err["loc"])
                raise ConfigError(f"algorithm.{key}: unknown key; {allowed}") from None
            raise ConfigError(format_validation_error(e, prefix="algorithm")) from None
        # Store the validated, defaulted values so model_dump() shows every parameter in effect.
        self.__pydantic_extra__.clear()
        self.__pydantic_extra__.update(params.model_dump())
        return self

    @property
    def params(self):
        return get_algorithm_class(self.name).Params(**(self.model_extra or {}))


@functools.cache
def _finite_params(params: type[BaseModel]) -> type[BaseModel]:
    """``params`` refusing inf and nan in its float fields, as the config's own sections do.

    The algorithms declare plain pydantic models; this subclass (same name, so errors read the same)
    only adds ``allow_inf_nan=False``, which pydantic checks before the model's own validators run."""
    return type(params.__name__, (params,), {"__module__": params.__module__, "__doc__": params.__doc__,
                                             "model_config": ConfigDict(allow_inf_nan=False)})


class ServerDataConfig(_Strict):
    """Hybrid FL (FedCLG): the server's own small dataset, disjoint from every client's."""
    fraction: float = Field(
        0.0, ge=0, lt=0.5, description="m_s as a share of the training set: the server's data each round "
        "(FedCLG: 0.01 on MNIST, 0.05 on CIFAR). 0 = no server data.")
    size: int | None = Field(None, ge=1, description="m_s as a number of samples (overrides `fraction`).")
    pool_factor: float = Field(
        2.0, ge=1, description="The server's pool holds pool_factor·m_s training samples, taken out of the "
        "clients' data; each round's m_s samples are drawn from it (`resample`).")
    resample: bool = Field(True, description="Draw the round's m_s samples afresh from the pool every round "
                           "(D_s^t of the FedCLG paper); false keeps one fixed set.")
    shift: float | None = Field(
        None, gt=0, le=1, description="Target cosine similarity between the server's and the global label "
        "distributions (FedCLG Fig. 7 uses 0.95); unset mirrors the global label mix.")
    steps: int = Field(1, ge=0, description="E_s: server SGD steps on its data after each aggregation.")
    lr: float = Field(0.05, gt=0, description="γ, the server learning rate at round 0; decays with "
                      "local.lr_decay down to local.lr_min, as in the FedCLG paper.")
    batch_size: int = Field(128, ge=1, description="Server minibatch size (FedCLG: 128).")


class ServerConfig(_Strict):
    optimizer: Literal["sgd", "momentum", "adam"] = Field(
        "sgd", description="Server optimizer on the pseudo-gradient: `sgd` (FedAvg), `momentum` (FedAvgM), "
        "`adam` (FedAdam).")
    lr: float = Field(1.0, gt=0, description="η_g, the server (global) learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="`momentum`: β; `adam`: β1.")
    beta2: float = Field(0.99, ge=0, lt=1, description="`adam`: β2.")
    eps: float = Field(1e-3, gt=0, description="`adam`: ε (FedAdam uses a large ε, e.g. 1e-3).")


class EvalConfig(_Strict):
    every: int = Field(1, ge=1, description="Evaluate (the test split, and the validation split where there is one) "
                       "every this many rounds (and at the end).")
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="Accuracy that counts as reached for `rounds_to_target` (test accuracy) "
        "and `val_rounds_to_target` (validation accuracy).")
    batch_size: int = Field(1024, ge=1, description="Batch size of the evaluation forward passes.")
    validation_clients: int | None = Field(
        None, ge=1, description="`data.validation: federated`: how many clients each evaluation draws to pool their "
        "validation samples into val/* (unset: every client); few clients, noisy val/* (Kuo et al., MLSys 2023).")
    clients: int | Literal["all"] | None = Field(
        None, description="Per-client evaluation at every evaluation (docs/run.md, Per-client evaluation): `all` "
        "clients, or this many drawn once for the run from (seed, -1, \"eval clients\"); each is scored on its own "
        "test data (`client_test`) and, with a validation split, its own validation data, giving clients/* "
        "(the global model), finetuned/* (`finetune_steps`) and personal/* (an algorithm's personal models). "
        "Unset: off.")
    client_test: Literal["auto", "natural", "matched"] = Field(
        "auto", description="Each evaluated client's test data: `natural`, its own test samples where the dataset "
        "has them (LEAF's users, `synthetic`'s clients, a dataset's `client_test_indices`); `matched`, `client_test_size` samples drawn "
        "from the test split with the client's training label mix; `auto`: natural where there are any, else "
        "matched.")
    client_test_size: int = Field(
        100, ge=1, description="`client_test: matched`: test samples drawn for each evaluated client (the class "
        "counts by largest remainder of its label shares, each class at most what the test split holds); the "
        "same count is drawn from a central validation split for its validation twin.")
    unseen_clients: float = Field(
        0.0, ge=0, lt=1, description="With `clients`: this share of the N clients (round(share·N), at least one) "
        "is held out of training entirely, drawn once for the run from (seed, -1, \"unseen clients\"): rounds "
        "sample K of the others, and per-client evaluation scores the held-out ones apart, giving unseen/* (the "
        "global model) and unseen_finetuned/* (`finetune_steps`): how the model serves clients that never "
        "trained (pFL-Bench's unseen clients; the participation gap of Yuan et al., ICLR 2022, is "
        "clients/accuracy_mean − unseen/accuracy_mean). `clients: N` draws up to N of each group. 0: off.")
    finetune_steps: int = Field(
        0, ge=0, description="With `clients`: also score the global model fine-tuned on each evaluated client's "
        "training data for this many local SGD steps (batch `local.batch_size`, lr `finetune_lr`), the FedAvg+FT "
        "baseline: finetuned/*. 0: off.")
    finetune_lr: float | None = Field(
        None, gt=0, description="The fine-tuning steps' lr (default `local.lr`, undecayed).")
    divergence_factor: float | None = Field(
        1000.0, gt=1, description="A round whose `train/loss` is above this many times ln(number of classes), "
        "the loss of a uniform guess (2.30 for 10 classes), marks the run diverged and stops it, as a NaN/inf "
        "loss or model always does; null: NaN/inf only. Why 1000 (docs/design.md §2.8; measured 2026-11-26 on "
        "2-core x86_64 with `python docs/results/divergence_scan.py`): in the shipped sweeps' settings, runs "
        "that learn peak below 12×; runs that stall near chance without blowing up reach 306× (mnist_5k at "
        "η_l = 0.8 in sweeps/fedlga_safeguards.yaml, whose rule counts them as not diverged); runs that blow "
        "up pass 10^4× (SCAFFOLD on mnist_5k at η_l = 0.34) and go on to 10^8×.")


class MlflowConfig(_Strict):
    enabled: bool = Field(True, description="Log the run to MLflow.")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db.")
    experiment: str = Field("fedsweep", description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name (default: algorithm and a short config tag).")
    log_model: bool = Field(True, description="Log the final model state dict as an artifact.")
    retry_seconds: float = Field(
        120.0, ge=0, description="How long a run's end waits for an MLflow store that fails (locked by another "
        "writer, full, not answering) before it keeps the run's records in ./fedsweep_unlogged/ for "
        "`fedsweep log` (a sweep's: until `--resume`). The run trains on while the store fails, its writes "
        "retried in the background; a store that refuses the run for good (a deleted experiment) is not waited "
        "for. 120 s rides out a store locked for a minute (sqlite itself waits 20 s a try).")


class RunConfig(_Strict):
    plugins: list[str] = Field(
        default_factory=list, description="Your own algorithms, models and datasets (docs/extending.md): paths of "
        "`.py` files or package folders, relative to the file that names them (on the command line: to the working "
        "folder), or module names on Python's path; imported before the rest of the config is read, in every Ray "
        "worker too. Kept resolved (absolute paths); each run records their files and hashes.")
    seed: int = Field(0, ge=0, description="Seed of every random draw (partition, sampling, batches, init).")
    rounds: int = Field(50, ge=1, description="R, the number of federated rounds.")
    engine: Literal["auto", "vectorized", "loop"] = Field(
        "auto", description="`vectorized`: all K clients at once (torch.func); `loop`: one client after "
        "another, the readable reference; same seed, same numbers. `auto`: `loop` for models with "
        "convolutions on a CPU, `vectorized` otherwise (the rule measured in benchmarks/README.md); the "
        "run header and the MLflow param `engine_used` say which ran.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="`auto` uses CUDA when available.")
    matmul_precision: Literal["highest", "high", "medium"] = Field(
        "highest", description="float32 matrix products while a run trains "
        "(`torch.set_float32_matmul_precision`, put back afterwards). `highest`: full float32, the same "
        "numbers on every machine. `high` (TF32 or two bfloat16s) and `medium` (bfloat16): faster where "
        "the hardware has such units (NVIDIA tensor cores; oneDNN on some Intel CPUs), with errors of "
        "about 1e-3 (`high`) or 1e-2 (`medium`) relative in each product; elsewhere the same as "
        "`highest`. CUDA convolutions follow PyTorch's cuDNN default (TF32 allowed) either way.")
    clients_per_round: int = Field(10, ge=1, description="K, clients sampled per round (K = N: all).")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    heterogeneity: HeterogeneityConfig = Field(default_factory=HeterogeneityConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    server_data: ServerDataConfig = Field(default_factory=ServerDataConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        """The plugins first: the sections after name what they register."""
        if isinstance(data, dict) and data.get("plugins"):
            from fedsweep.config.plugins import load_plugins, resolve
            data = {**data, "plugins": resolve(data["plugins"])}   # relative: to the working folder
            load_plugins(data["plugins"])
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        n, k = self.data.num_clients, self.clients_per_round
        if k > n:
            raise ConfigError(f"clients_per_round: K={k} is larger than data.num_clients N={n}; allowed 1..{n}")
        check_local_work(self.heterogeneity, self.local.steps)
        sd = self.server_data
        if (sd.fraction == 0 and sd.size is None) and getattr(
                get_algorithm_class(self.algorithm.name), "needs_server_data", False):
            raise ConfigError(f"server_data.fraction: algorithm {self.algorithm.name!r} trains on server data; "
                              f"set server_data.fraction > 0 (FedCLG: 0.01-0.1) or server_data.size")
        check_validation_clients(self.data, self.eval)
        check_client_evaluation(self.data, self.eval, self.clients_per_round)
        return self

    # -- helpers -------------------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """Flattened `a.b.c -> value` view (MLflow params, sweep keys)."""
        return flatten(self.model_dump(mode="json"))


# ---------------------------------------------------------------------------------------------
# Loading, overrides, errors
# ---------------------------------------------------------------------------------------------

def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def copy_tree(value: Any) -> Any:
    """A copy of plain YAML data (mappings and lists copied, scalars shared), much faster than
    ``copy.deepcopy``, which a sweep of many trials calls once per trial."""
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_tree(v) for v in value]
    return value


def set_dotted(d: dict, key: str, value: Any, _outer: str = "") -> None:
    """Set ``d['a']['b'] = value`` for ``key='a.b'``, creating dicts on the way.

    A mapping given for a section merges into it: it sets only the keys it names (at any depth) and
    keeps the others as ``d`` has them, so ``local={lr: 0.1}`` changes η_l and nothing else. Every way
    a value reaches a config goes through here (``--set``, grids, method grids, drawn search values),
    so they all mean the same. ``value`` is copied: ``d`` never shares a mapping with the caller."""
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{_outer}{key}: {p!r} is a value, not a section")
        d = nxt
    last = parts[-1]
    if not (isinstance(value, dict) and isinstance(d.get(last, {}), dict)):
        d[last] = copy_tree(value)
        return
    section = d.setdefault(last, {})
    for k, v in value.items():   # a key inside may be dotted too: {partition.kind: iid}
        if isinstance(k, str):
            set_dotted(section, k, v, f"{_outer}{key}.")
        else:
            section[k] = copy_tree(v)   # not a config key: validation names it


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is parsed as YAML (so 0.1, true, [1, 2] work; a
    value that is not YAML is taken as the string it is, but a mapping with a key given twice is refused)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected key=value, e.g. --set local.lr=0.1")
    key, raw = text.split("=", 1)
    try:
        value = yaml.load(raw, Loader=UniqueKeyLoader) if raw != "" else None   # noqa: S506 - a SafeLoader
    except DuplicateKey as e:
        raise ConfigError(f"--set {text}: duplicate key {e.key!r}; a key may appear once in a mapping") from None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def format_validation_error(e: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``key: what is wrong (allowed ...)``; the first problem is enough to act on."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(e, err)
        return f"{key}: unknown key; allowed here: {', '.join(allowed)}" if allowed else f"{key}: unknown key"
    if kind == "literal_error":
        return f"{key}: {err.get('input')!r} is not allowed; {msg[0].lower() + msg[1:]}"
    if kind == "value_error" and msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    inp = err.get("input")
    shown = f" (got {inp!r})" if not isinstance(inp, dict) and kind != "missing" else ""
    return f"{key}: {msg}{shown}" if key else f"{msg}{shown}"


def _allowed_keys(e: ValidationError, err: dict) -> list[str]:
    model: Any = _MODELS_BY_TITLE.get(e.title)
    for p in err["loc"][:-1]:
        if model is None:
            break
        field = model.model_fields.get(p)
        model = field.annotation if field is not None else None
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


_MODELS_BY_TITLE: dict[str, type[BaseModel]] = {}


def register_models(*models: type[BaseModel]) -> None:
    """Let error messages list the allowed keys of these models (looked up by the error's title)."""
    for m in models:
        _MODELS_BY_TITLE[m.__name__] = m


register_models(RunConfig, DataConfig, PartitionConfig, ModelConfig, LocalConfig,
                HeterogeneityConfig, AlgorithmConfig, ServerConfig, ServerDataConfig, EvalConfig, MlflowConfig)


def build_config(raw: dict | None, overrides: list[str] | None = None) -> RunConfig:
    """Validate a raw dict (plus ``key=value`` overrides) into a RunConfig, or raise ConfigError."""
    raw = copy_tree(raw or {})   # overrides write into nested sections: never into the caller's
    for text in overrides or []:
        key, value = parse_override(text)
        set_dotted(raw, key, value)
    return validate_raw(raw)


def validate_raw(raw: dict) -> RunConfig:
    """``raw`` (read, never kept) as a RunConfig, or a ConfigError naming the first wrong key."""
    try:
        return RunConfig(**raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def load_yaml(path: str | Path) -> dict | None:
    """The top-level mapping of a YAML file, or None for a file with nothing in it (or only comments)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file (byte {e.start} is not UTF-8 text); a config or sweep file is "
                          "YAML text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: not a text file (it holds NUL bytes); a config or sweep file is YAML text")
    raw = parse_yaml(text, str(path))
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    return raw


#: What a sweep file holds besides `base` that `fedsweep run` does not use.
SWEEP_ONLY = ("grid", "methods", "search", "seeds")


def read_run_config(path: str | Path, doing: str = "running") -> tuple[dict, str]:
    """A run config's raw mapping and a note for the user ('' if none). A sweep file (one with a
    ``base:`` mapping) gives its base, and the note says so: its grid and the like are not ``doing``."""
    raw = load_yaml(path)
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (or holds only comments); write the config keys to change "
                          "in it, or `{}` to run every default")
    if not isinstance(raw.get("base"), dict):
        return with_plugins(raw, path), ""
    raw = {**raw, "base": with_plugins(raw["base"], path, also=raw.get("plugins"))}
    unused = [k for k in SWEEP_ONLY if raw.get(k)]
    listed = ", ".join(unused[:-1]) + " and " + unused[-1] if len(unused) > 1 else "".join(unused)
    what = f"its {listed} {'are' if len(unused) > 1 else 'is'} for" if unused else "the sweep runs with"
    return raw["base"], f"{path} is a sweep file: {doing} its base config only ({what} `fedsweep tune {path}`)"


def with_plugins(raw: dict, path: str | Path | None, also=None, key: str = "plugins") -> dict:
    """``raw`` with its ``plugins`` (and ``also``: a sweep file's top-level ones, first) resolved against
    the folder of the file ``path`` that names them (None: the working folder), so a config read from
    a file means the same files wherever it is run from."""
    from fedsweep.config.plugins import resolve
    base = Path(path).resolve().parent if path is not None else None
    specs = resolve(also, base, key) + resolve(raw.get("plugins"), base, key)
    if not specs:
        return raw
    return {**raw, "plugins": list(dict.fromkeys(specs))}
