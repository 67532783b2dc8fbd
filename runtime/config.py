"""The one configuration tree, built and validated once in the launcher and passed down explicitly.

Every actor receives only its sub-config; nothing mutates it later. This module is the only reader of
environment variables, and it sits at the bottom of the import graph: it imports nothing of the project.
Names that a registry owns (quantization methods, attention backends) are checked by that registry when
the engine resolves the config (``runtime.resolve``), which also fills in the CPU paths the capability
gates choose; ``option(registry=...)`` marks those fields, and the CLI takes their choices from there.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


BLOCK_SIZE = 16
_DTYPES = ("float32", "bfloat16", "float16")
# vLLM's spellings of --dtype; "auto" is the checkpoint's own (resolved once, in EngineConfig.validate)
DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_DTYPE_ALIASES = {"half": "float16", "float": "float32"}
ISAS = ("generic", "avx2", "avx512")  # the CPU levels the capability gates know, lowest first
MAX_N = 4096  # the ceiling of the configured maximum n (SchedulerConfig.max_n)
# With no budget given, the KV cache is this fixed size (vLLM's CPU default, VLLM_CPU_KVCACHE_SPACE=4), so
# that it is the same from one start to the next, capped at a share of the memory available at start-up
_DEFAULT_KV_BYTES = 4 << 30
_KV_SHARE_OF_AVAILABLE = 0.5
KV_SPACE_ENV = "ACTORSERVE_CPU_KVCACHE_SPACE"  # GiB, as vLLM's VLLM_CPU_KVCACHE_SPACE
# vLLM's --kv-cache-dtype spellings taken here: "auto" is the model's dtype (its fp8 caches are not built)
KV_CACHE_DTYPES = ("auto", "bfloat16")

_CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "actorserve")
_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable: unset or empty is the default; 1 / true / yes / on and 0 / false / no
    / off in any case; anything else is refused, so that a misspelt "off" does not leave a path on."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text not in _FLAG_WORDS:
        raise ValueError(f"{name} must be one of 1, true, yes, on, 0, false, no, off; got {os.environ[name]!r}")
    return _FLAG_WORDS[text]


def env_cpu_isa() -> Optional[str]:
    """ACTORSERVE_CPU_ISA: the fast paths of a lesser CPU (unset or empty: this CPU's own)."""
    return os.environ.get("ACTORSERVE_CPU_ISA") or None


def env_cpu_kernels() -> bool:
    """ACTORSERVE_CPU_KERNELS: 0 switches every C kernel and prepacking off."""
    return env_flag("ACTORSERVE_CPU_KERNELS", True)


def environment() -> dict[str, str]:
    """This process's environment, for a child that starts with it."""
    return dict(os.environ)


def tokenizer_cache_dir() -> str:
    """ACTORSERVE_TOKENIZER_CACHE: where converted tokenizers are kept."""
    return os.environ.get("ACTORSERVE_TOKENIZER_CACHE") or os.path.join(_CACHE_ROOT, "tokenizers")


def kernel_cache_dir() -> str:
    """ACTORSERVE_KERNEL_CACHE: where the C kernels are built."""
    return os.environ.get("ACTORSERVE_KERNEL_CACHE") or os.path.join(_CACHE_ROOT, "kernels")


def c_compiler_names() -> list[str]:
    """The C compilers to try, CC first, as build tools do."""
    return [name for name in (os.environ.get("CC"), "cc", "gcc", "clang") if name]


def hf_hub_cache() -> str:
    """The Hugging Face hub cache, where hub ids are looked up (HF_HUB_CACHE, else HF_HOME/hub)."""
    return os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")


def triton_interpreted() -> bool:
    """TRITON_INTERPRET=1: triton runs its kernels in its interpreter (the CPU's only triton, for tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def cuda_home() -> Optional[str]:
    """CUDA_HOME (or CUDA_PATH): the CUDA toolkit that torch's extension builder would use."""
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or None


def option(default: Any = None, help: str = "", *, factory: Optional[Callable[[], Any]] = None,
           cli: bool = True, choices: Optional[Sequence[Any]] = None, aliases: Sequence[str] = (),
           parse: Optional[Callable[[str], Any]] = None, registry: Optional[str] = None) -> Any:
    """A config field and its command-line flag in one place: ``actorserve.cli`` generates the flags of
    every engine command from these (``--field-name``; a bool is ``--x`` / ``--no-x``), so the commands
    cannot disagree. ``cli=False``: set from Python or by the launcher only. ``parse``: how the flag's
    text becomes the value, where the field's type is not a plain one. ``registry``: the registry whose
    names the field takes (``runtime.resolve.REGISTRIES``), which checks it and lists the flag's choices."""
    meta = {"help": help, "cli": cli, "choices": choices, "aliases": tuple(aliases), "parse": parse,
            "registry": registry}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to run and how."""

    model: Optional[str] = option(None, "a .gguf file, an HF model directory, or an HF hub id (Org/Name) found "
                                        "in the local HF cache (default: the embedded SmolLM2)", cli=False)
    tokenizer: Optional[str] = option(None, "a tokenizer directory or file (default: the model's own), for every "
                                            "process")
    dtype: str = option("auto", "the compute dtype; auto: the checkpoint's (float32 for GGUF)", choices=DTYPE_CHOICES)
    max_model_len: Optional[int] = option(None, "the context length (default: the model's); 32k style values "
                                                "(k = 1000, K = 1024)")
    seed: int = option(0, "the seed of unseeded requests' sampling")
    skip_tokenizer_init: bool = option(False, "token ids in and out, no tokenizer")
    quantization: Optional[str] = option(None, "how the weights are held and multiplied", registry="quantization",
                                         aliases=("-q",))
    # vLLM's switch off the captured decode step: here the decode fast path (runtime.model.execution.decode_fast_path)
    enforce_eager: bool = option(False, "run every step through the model's modules (no decode fast path), "
                                        "as vLLM's flag")
    trust_remote_code: bool = option(False, "accepted as vLLM's flag; a model whose config.json needs its own "
                                            "code (auto_map) is refused either way: no remote code runs here")

    def validate(self) -> None:
        if self.dtype not in _DTYPES and self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size, memory budget, prefix caching."""

    block_size: int = option(BLOCK_SIZE, "tokens per KV cache block")
    kv_cache_memory: Optional[int] = option(None, "the KV cache in bytes (4G, 512M, 4Gi style values); default: "
                                                  "ACTORSERVE_CPU_KVCACHE_SPACE GiB, else 4 GiB capped at half the "
                                                  "memory available", aliases=("--kv-cache-memory-bytes",))
    enable_prefix_caching: bool = option(True, "reuse the KV blocks of a cached prompt prefix",
                                         aliases=("--prefix-caching",))
    kv_cache_dtype: str = option("auto", "what the KV cache holds: auto (the model's dtype) or bfloat16 (an fp32 "
                                         "model's K and V rounded to bf16: half the memory a token, half the bytes "
                                         "a decode step reads)", choices=KV_CACHE_DTYPES)

    def validate(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}")
        _env_kv_space()

    def kv_cache_budget(self) -> tuple[int, str]:
        """The budget in bytes, and where it came from (for the start-up log)."""
        if self.kv_cache_memory is not None:
            return self.kv_cache_memory, "kv_cache_memory"
        env = _env_kv_space()
        if env is not None:
            return env, KV_SPACE_ENV
        cap = int(_available_memory_bytes() * _KV_SHARE_OF_AVAILABLE)
        if cap < _DEFAULT_KV_BYTES:
            return cap, f"the default {_DEFAULT_KV_BYTES / 2**30:g} GiB, capped at half the memory available"
        return _DEFAULT_KV_BYTES, "the default; set kv_cache_memory or ACTORSERVE_CPU_KVCACHE_SPACE (GiB)"


SPEC_METHODS = ("ngram", "draft_model")
EXECUTOR_BACKENDS = ("mp", "ray")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding, as vLLM's ``speculative_config`` JSON spells it (``runtime.engine.spec_decode``):
    ``method`` "ngram" proposes ``num_speculative_tokens`` draft tokens a step by prompt lookup of the last
    ``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens (vLLM's defaults: 5, and either one for the
    other where only one is given); "draft_model" has ``model``, a smaller model with the same vocabulary,
    propose them (a ``model`` without a method means this one, as in vLLM), its weights optionally
    quantized by ``quantization``."""

    method: Optional[str]
    num_speculative_tokens: int
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None
    model: Optional[str] = None
    quantization: Optional[str] = None

    @classmethod
    def parse(cls, value: Any) -> "SpeculativeConfig":
        """From the JSON text of ``--speculative-config``, a dict, or a SpeculativeConfig; ValueError naming
        what is wrong."""
        if isinstance(value, SpeculativeConfig):
            return value.checked()
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown} (known: {sorted(known)})")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs num_speculative_tokens")
        if value.get("method") is None and value.get("model") is not None:
            value = {**value, "method": "draft_model"}
        if "method" not in value:
            raise ValueError(f"speculative_config needs a method, one of {SPEC_METHODS}")
        return cls(**value).checked()

    def checked(self) -> "SpeculativeConfig":
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative_config method must be one of {SPEC_METHODS}, got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
            raise ValueError(f"speculative_config num_speculative_tokens must be an integer in [1, 64], got {k!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = 5
        low, high = (high if low is None else low), (low if high is None else high)
        for name, v in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name} must be an integer >= 1, got {v!r}")
        if high < low:
            raise ValueError(f"speculative_config prompt_lookup_max ({high}) is below prompt_lookup_min ({low})")
        if self.method == "draft_model" and not isinstance(self.model, str):
            raise ValueError("speculative_config method draft_model needs a model: a .gguf file or an HF model "
                             "directory with the target's vocabulary")
        if self.method != "draft_model" and (self.model is not None or self.quantization is not None):
            raise ValueError(f"speculative_config model and quantization are for method draft_model, not "
                             f"{self.method!r}")
        return dataclasses.replace(self, prompt_lookup_min=low, prompt_lookup_max=high)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits, and speculative decoding's drafts."""

    max_num_seqs: int = option(256, "the most sequences in one step")
    max_num_batched_tokens: int = option(2048, "the most tokens in one step")
    enable_chunked_prefill: bool = option(True, "split long prompts over steps, beside the decodes")
    max_n: int = option(128, "the most samples (n) one request may ask for, at every way in")
    max_waiting_seqs: Optional[int] = option(None, "the most sequences that may wait for a place in the batch: a "
                                                   "request past it is refused at once (HTTP 503, Retry-After), one "
                                                   "larger than it is a 400 (default: no bound in Python; 4096 for "
                                                   "serve and serve-zmq)")
    grammar_compile_seconds: float = option(10.0, "a structured-outputs grammar's compile, in a process of its "
                                                   "own; longer is refused (HTTP 400)")
    grammar_compile_memory: int = option(1 << 30, "bytes that compile may allocate; more is refused (HTTP 400)")
    reasoning_parser: Optional[str] = option(
        None, "the reasoning model's format (vLLM's names): its thinking is split from the answer, and structured "
              "outputs constrain the answer after the thinking", registry="reasoning_parser")
    speculative_config: Optional[SpeculativeConfig] = option(
        None, 'speculative decoding, as vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": 4, '
              '"prompt_lookup_max": 4, "prompt_lookup_min": 2}, or {"method": "draft_model", "model": PATH, '
              '"num_speculative_tokens": 3}', parse=SpeculativeConfig.parse)

    def __post_init__(self) -> None:
        if self.speculative_config is not None:  # a dict or JSON text from Python, checked once here
            object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))

    def validate(self) -> None:
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {self.max_n}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_waiting_seqs is not None and self.max_waiting_seqs < 1:
            raise ValueError(f"max_waiting_seqs must be >= 1, got {self.max_waiting_seqs}")
        if not self.grammar_compile_seconds > 0:
            raise ValueError(f"grammar_compile_seconds must be > 0, got {self.grammar_compile_seconds}")
        if self.grammar_compile_memory < 64 << 20:
            raise ValueError(f"grammar_compile_memory must be at least 64 MiB, got {self.grammar_compile_memory}")


@dataclass(frozen=True)
class ParallelConfig:
    """Pipeline parallelism (the layers split over worker processes) and data parallelism (engine replicas)."""

    pipeline_parallel_size: int = option(1, "worker stages, one process each", aliases=("-pp",))
    data_parallel_size: int = option(1, "engine replicas (a scheduler and its workers each) behind one frontend",
                                     aliases=("-dp",))
    data_parallel_rank: int = option(0, cli=False)  # which replica this config is (set by the launcher)
    distributed_executor_backend: str = option("mp", "mp: the engine's processes on this machine; ray: Ray actors "
                                                     "in a placement group (a running cluster, or a local one)",
                                               choices=EXECUTOR_BACKENDS)
    master_addr: str = option("127.0.0.1", "torch.distributed rendezvous of the worker stages")
    master_port: Optional[int] = option(None, "its port (default: a free one)")
    # Stages on one host must not oversubscribe the cores: spinning OpenMP threads starve the others.
    threads_per_worker: Optional[int] = option(None, "compute threads of each worker (default: every core with "
                                                     "one stage, the cores shared out with several)")

    def validate(self) -> None:
        if self.pipeline_parallel_size < 1:
            raise ValueError(f"pipeline_parallel_size must be >= 1, got {self.pipeline_parallel_size}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS}, got "
                             f"{self.distributed_executor_backend!r}")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(f"data_parallel_rank must be in [0, {self.data_parallel_size}), got "
                             f"{self.data_parallel_rank}")

    def worker_threads(self) -> Optional[int]:
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        workers = self.pipeline_parallel_size * self.data_parallel_size
        if workers == 1:
            return None
        return max(1, (os.cpu_count() or 1) // workers)


@dataclass(frozen=True)
class CpuPaths:
    """Which CPU fast paths this process takes, as the capability gates (``kernels.capability.detect``)
    decided them; every field an independent predicate."""

    isa: str  # the level the gates saw: this CPU's, or the override's where that is lower
    hardware_isa: str  # this CPU's own level
    kernels_enabled: bool = True  # False: ACTORSERVE_CPU_KERNELS=0, every C kernel and prepacking off
    kernel_isa: Optional[str] = None  # the C kernels' build: "avx512_bf16", "avx2", or None (none run)
    q8_isa: Optional[str] = None  # the q8 products' build: "avx512_vnni", "avx2", or None
    prepacked_bf16: bool = False
    int_mm: bool = False
    int_mm_exact: bool = False
    bf16_gemm: bool = False

    def describe(self) -> str:
        on = ([f"C kernels ({self.kernel_isa})"] if self.kernel_isa else []) + (
            [f"q8 products ({self.q8_isa})"] if self.q8_isa else []) + [
            name for name in ("prepacked_bf16", "int_mm", "int_mm_exact", "bf16_gemm") if getattr(self, name)]
        seen = self.isa if self.isa == self.hardware_isa else f"{self.isa} (override; this CPU: {self.hardware_isa})"
        return f"CPU {seen}; fast paths on: {', '.join(on) or 'none'}" + (
            "" if self.kernels_enabled else " (ACTORSERVE_CPU_KERNELS=0)")


@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs, and which of the CPU's fast paths it may take."""

    device: str = option("cpu", "where the model runs: cpu, cuda, cuda:N, or auto (CUDA where torch sees it)")
    attention_backend: Optional[str] = option(None, "force an attention backend; default: the device's best that "
                                                    "serves the model", registry="attention_backend")
    # CUDA graphs of decode steps (runtime.model.execution.cuda_graphs): vLLM's flags; --enforce-eager turns them off
    max_cudagraph_capture_size: int = option(512, "the largest decode batch captured as a CUDA graph (also capped "
                                                  "by max_num_seqs and max_num_batched_tokens)")
    cudagraph_capture_sizes: Optional[tuple[int, ...]] = option(
        None, "the decode batch sizes to capture, comma-separated (default 1, 2, 4, then multiples of 8)",
        parse=lambda text: tuple(int(x) for x in text.split(",") if x.strip()))
    # Every capability gate sees a lesser CPU than this one: the paths of an AVX2-only or a generic
    # x86-64 machine, run on this one
    cpu_isa: Optional[str] = option(help="the fast paths of a lesser CPU than this one (as ACTORSERVE_CPU_ISA)",
                                    factory=env_cpu_isa, choices=ISAS)
    cpu_kernels: bool = option(help="the C kernels and prepacking (ACTORSERVE_CPU_KERNELS=0 switches them off)",
                               factory=env_cpu_kernels)
    # The paths the gates chose, resolved once with the config (``runtime.resolve``); None until then
    cpu_paths: Optional[CpuPaths] = option(None, cli=False)

    def validate(self) -> None:
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.max_cudagraph_capture_size < 1:
            raise ValueError(f"max_cudagraph_capture_size must be >= 1, got {self.max_cudagraph_capture_size}")
        if self.cudagraph_capture_sizes is not None and any(s < 1 for s in self.cudagraph_capture_sizes):
            raise ValueError(f"cudagraph_capture_sizes must be >= 1, got {self.cudagraph_capture_sizes}")
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ValueError(f"device {self.device!r}: torch sees no CUDA device (a CPU build of torch, or no "
                                 "GPU); use --device cpu or auto")
            index = int(self.device.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                raise ValueError(f"device {self.device!r}: torch sees {torch.cuda.device_count()} CUDA devices")
        if self.cpu_isa is not None and self.cpu_isa not in ISAS:
            raise ValueError(f"cpu_isa (ACTORSERVE_CPU_ISA) must be one of {ISAS}, got {self.cpu_isa!r}")

    def torch_device(self, stage: int = 0) -> str:
        """The device pipeline stage ``stage`` runs on, as torch names it: ``auto`` resolved, and on CUDA
        one GPU a stage from the one named (cuda: cuda:0, cuda:1, ...)."""
        device = self.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            return device
        return f"cuda:{int(device.partition(':')[2] or 0) + stage}"


_MODES = ("multiprocess", "inprocess")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the actors are laid out and supervised."""

    mode: str = option("multiprocess", "or inprocess: the same actors on the caller's loop", cli=False)
    # the scheduler's client socket; None: an ipc:// path in a temp dir (serve-zmq's --address sets it)
    client_address: Optional[str] = option(None, cli=False)
    start_timeout: float = option(300.0, "seconds for every process to load and report ready")
    shutdown_timeout: float = option(5.0, "seconds from close() or SIGTERM until every process has exited")
    health_timeout: float = option(5.0, "a health ping not answered in this long means the engine is stuck")
    # a process beats while its loop turns or a step of it computes (runtime.liveness): a slow step is no hang
    hang_timeout: float = option(30.0, "seconds without a heartbeat (its loop not turning and nothing "
                                       "computing) after which a process of the engine is declared hung (dead)")
    # a bigger ZMQ frame gets the DEALER disconnected before it is buffered (docs/protocol.md)
    max_request_body_bytes: int = option(4 << 20, "the largest HTTP request body, and the largest ZMQ message, a "
                                                  "client may send")
    # flow control (runtime/client.py): a client that stops reading a stream holds no place in the batch
    stream_backlog: int = option(8, "outputs of a request that its reader has not taken yet at which the "
                                     "request is paused; it resumes once the reader has taken three quarters")
    stream_stall_timeout: float = option(60.0, "seconds a paused request waits for its reader to take an "
                                               "output before it is aborted")
    # a raw ZMQ client that stops reading: libzmq reads on for a client of its own (whose receive queue is
    # unbounded), so only a client whose own queue is full leaves messages here (docs/protocol.md)
    client_send_limit: int = option(1024, "messages the scheduler queues for one ZMQ client connection that "
                                          "does not read them; one more, and the connection is closed and its "
                                          "requests aborted")
    # With a key, every client message on the ZMQ socket must carry it (``api_key``); others get an error
    client_api_key: Optional[str] = option(None, cli=False)
    # CurveZMQ on the client socket: the server's key pair (a zmq.auth certificate file with the secret
    # key), and a folder of the clients' public certificates allowed to connect
    curve_secret_key: Optional[str] = option(None, cli=False)
    curve_authorized_keys: Optional[str] = option(None, cli=False)
    # the embedded client's own public key (z85), admitted beside the folder's: set by AsyncEngine
    curve_launcher_key: Optional[str] = option(None, cli=False)
    log_level: str = option(help="DEBUG, INFO, WARNING or ERROR (ACTORSERVE_LOG_LEVEL)",
                            factory=lambda: os.environ.get("ACTORSERVE_LOG_LEVEL", "INFO"))
    enable_sleep_mode: bool = option(False, "sleep() / wake_up(): give back the weights' and the KV cache's "
                                            "memory while idle (and serve /sleep, /wake_up, /is_sleeping)")
    sleep_queue_requests: bool = option(False, "requests that arrive while the engine sleeps wait for wake-up "
                                               "(default: refused with EngineSleepingError, HTTP 503)")
    disable_log_stats: bool = option(False, "no stats line (throughput, requests, KV cache) every 10 s while busy")

    def validate(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.client_address is not None and not self.client_address.startswith(("ipc://", "tcp://")):
            raise ValueError(f"client_address must be ipc:// or tcp://, got {self.client_address!r}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}")
        if self.stream_backlog < 2:
            raise ValueError(f"stream_backlog must be >= 2, got {self.stream_backlog}")
        if self.client_send_limit < 16:
            raise ValueError(f"client_send_limit must be >= 16, got {self.client_send_limit}")
        for name in ("start_timeout", "shutdown_timeout", "health_timeout", "hang_timeout", "stream_stall_timeout"):
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
        """This config checked, in itself (``runtime.resolve`` checks it against the registries and this
        machine)."""
        self.model.validate()
        self.cache.validate()
        self.scheduler.validate()
        self.runtime.validate()
        self.parallel.validate()
        self.device.validate()
        spec = self.scheduler.speculative_config
        if spec is not None and spec.method == "draft_model" and self.parallel.pipeline_parallel_size > 1:
            raise ValueError("speculative decoding with a draft model needs pipeline_parallel_size 1 (the draft "
                             "runs beside the stage that verifies its tokens)")
        if self.parallel.pipeline_parallel_size > 1 and self.runtime.mode == "inprocess":
            raise ValueError("pipeline_parallel_size > 1 needs mode='multiprocess' (one process per stage)")
        if self.parallel.distributed_executor_backend == "ray" and self.runtime.mode == "inprocess":
            raise ValueError("distributed_executor_backend='ray' needs mode='multiprocess' (Ray runs the actors)")
        if self.parallel.data_parallel_size > 1:
            if self.runtime.mode == "inprocess":
                raise ValueError("data_parallel_size > 1 needs mode='multiprocess' (one ring of processes a replica)")
            if self.runtime.client_address is not None:
                raise ValueError("the ZMQ client protocol serves one engine ring: serve-zmq and --zmq-address take "
                                 "data_parallel_size 1 (the HTTP server balances several)")
        if not self.scheduler.enable_chunked_prefill and self.model.max_model_len is not None:
            if self.scheduler.max_num_batched_tokens < self.model.max_model_len:
                raise ValueError(
                    "without chunked prefill, max_num_batched_tokens "
                    f"({self.scheduler.max_num_batched_tokens}) must be >= max_model_len "
                    f"({self.model.max_model_len})"
                )
        config = self
        if self.model.dtype in _DTYPE_ALIASES:  # one spelling downstream ("auto" is the loader's to resolve)
            config = dataclasses.replace(config, model=dataclasses.replace(
                self.model, dtype=_DTYPE_ALIASES[self.model.dtype]))
        return config

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


def _env_kv_space() -> Optional[int]:
    raw = os.environ.get(KV_SPACE_ENV, "").strip()
    if not raw:
        return None
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"{KV_SPACE_ENV} must be a number of GiB, got {raw!r}") from None
    if not gib > 0 or gib != gib or gib == float("inf"):
        raise ValueError(f"{KV_SPACE_ENV} must be a positive number of GiB, got {raw!r}")
    return int(gib * 2**30)


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 << 30
