"""Text generation with decoder-only models (docs/generation.md).

A :class:`Generator` drives an ONNX decoder token by token: prefill over the prompt, then one decode step per new
token with the model's key/value cache kept on the session's device (``past_key_values.{i}.key`` ->
``present.{i}.key``, as transformers' and optimum's exports name it). A model without a cache runs in the recompute
form (the whole sequence every step). The loop, the cache and the sampling are C++ (``src/cpp/generation/``).

Examples
--------
>>> from xpuruntime.generation import Generator, GenerationConfig
>>> gen = Generator("decoder.onnx", GenerationConfig(max_new_tokens=8))
>>> gen.generate([1, 2, 3])                    # one prompt -> its new tokens
>>> gen.generate([[1, 2, 3], [4, 5]])          # a batch (left-padded) -> one list per row
>>> for token in gen.stream([1, 2, 3]):        # tokens as they come
...     print(token)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _core
from .inference import InferenceSession

# The profiler ranges every prefill run and every decode step run in (Note [Generation ranges]):
# ``profiler.summary(within=DECODE_RANGE)`` is the per-node table of the decode steps alone.
PREFILL_RANGE = _core.GENERATION_PREFILL_RANGE
DECODE_RANGE = _core.GENERATION_DECODE_RANGE

GenerationConfig = _core.GenerationConfig
GenerationConfig.__doc__ = """How tokens are chosen and when generation stops (keyword arguments only).

Parameters
----------
max_new_tokens : int
    New tokens per row at most (default 32).
max_length : int
    Prompt plus new tokens of the longest row at most; 0 (default): no limit beyond ``max_new_tokens``.
do_sample : bool
    False (default): greedy. True: draw from the distribution left by temperature, top_k and top_p.
temperature : float
    Positive (default 1.0); the logits are divided by it when sampling.
top_k : int
    Keep the k most likely tokens; 0 (default): off.
top_p : float
    In (0, 1]; keep the most likely tokens until their probability reaches top_p; 1.0 (default): off.
repetition_penalty : float
    Positive; 1.0 (default): off. Seen tokens (prompt included) lose likelihood.
seed : int
    Sampling seed; the same seed gives the same tokens (default 0).
stop_tokens : list of int
    A row ends after producing one of these (it is included in the output).
pad_token_id : int
    Fed for left padding and for rows that have ended (default 0).
cache : {"auto", "required", "none"}
    Use the model's cache when it has one (default), insist on it, or recompute every step.
padding : {"auto", "left", "right"}
    Where shorter rows of a batch are padded: "left" for transformers' exports, "right" for ONNX Runtime's
    GroupQueryAttention form; "auto" (default) picks right when the model uses GroupQueryAttention.
cache_layout : {"auto", "dynamic", "static"}
    How the Concat form's decode steps get the cache: "dynamic" the past as long as the sequence so far (a new shape
    every step), "static" the whole fixed-size cache with the unfilled positions masked (one shape: one plan, CUDA
    graph replays; needs attention_mask and position_ids inputs); "auto" (default): static where the model has both,
    else dynamic.
sampling : {"auto", "host", "device"}
    Where sampled rows (and greedy rows with a repetition penalty) draw their tokens: "host" the Sampler (the logits
    rows copied to the host; the same tokens on every platform), "device" where the logits are (the ``sample_rows``
    kernel on a GPU, only the token ids come back; the same definition on the host for a CPU session; Philox per row
    and step: the same tokens every run on one kind of device, but not the host Sampler's); "auto" (default): "device"
    where the logits are on a GPU, "host" on the CPU (docs/generation.md "Sampling where the logits are").

Bad values raise :class:`~xpuruntime.InvalidArgumentError` naming the field.
"""

Prompts = Union[Sequence[int], Sequence[Sequence[int]], np.ndarray]


def _uses_group_query_attention(model: Union[str, Path, bytes]) -> bool:
    """Whether the model file holds a com.microsoft GroupQueryAttention node (its graph and subgraphs; weights in
    external data are not read)."""
    try:
        import onnx
    except ImportError:  # no onnx package: the C++ side decides (docs/generation.md)
        return False
    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model),
                                                                                        load_external_data=False)
    except Exception:  # noqa: BLE001: an unreadable model fails in the session with a typed error instead
        return False

    def graphs(graph):
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    yield from graphs(attr.g)
                for sub in attr.graphs:
                    yield from graphs(sub)

    return any(node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft"
               for graph in graphs(proto.graph) for node in graph.node)


def _session_and_config(model: Any, config: Optional["GenerationConfig"], device: Any, engine: str,
                        session_options: dict) -> "tuple[InferenceSession, GenerationConfig]":
    """The session (made of a path or bytes, or the one given) and the config with padding="auto" resolved."""
    session = model if isinstance(model, InferenceSession) else InferenceSession(model, device=device, engine=engine,
                                                                                 **session_options)
    source = getattr(session, "_made_from", None) if isinstance(model, InferenceSession) else model
    return session, _resolved(config if config is not None else GenerationConfig(), source)


def _resolved(config: "GenerationConfig", model: Any) -> "GenerationConfig":
    """config with padding="auto" made "right" for a GroupQueryAttention model given as a path or bytes (a session
    given as such: the C++ side resolves it from the session, Note [Padding sides])."""
    if config.padding != "auto" or not isinstance(model, (str, Path, bytes)):
        return config
    if _uses_group_query_attention(model):
        import copy

        config = copy.copy(config)
        config.padding = "right"
    return config


def _as_batch(input_ids: Prompts) -> "tuple[List[List[int]], bool]":
    """The prompts as a list of rows, and whether a single prompt was given (1-D)."""
    if isinstance(input_ids, np.ndarray):
        if input_ids.ndim not in (1, 2) or input_ids.dtype.kind not in "iu":
            raise _core.InvalidTypeError(f"input_ids must be a 1-D or 2-D integer array, got {input_ids.dtype}"
                                         f"{list(input_ids.shape)}")
        single = input_ids.ndim == 1
        rows = [input_ids.tolist()] if single else input_ids.tolist()
        return rows, single
    items = list(input_ids)
    if not items:
        raise _core.InvalidArgumentError("input_ids is empty: give one prompt (a list of ids) or a list of prompts")
    if all(isinstance(t, (int, np.integer)) for t in items):
        return [[int(t) for t in items]], True
    if all(not isinstance(r, (str, bytes)) and hasattr(r, "__iter__") for r in items):
        return [[int(t) for t in row] for row in items], False
    raise _core.InvalidTypeError("input_ids must be a list of token ids or a list of such lists")


class Generator:
    """Generates tokens with a decoder model.

    Parameters
    ----------
    model : str, Path, bytes or InferenceSession
        The decoder (see docs/generation.md for the forms accepted), or a session already made of it.
    config : GenerationConfig, optional
        Default: greedy, 32 new tokens.
    device, engine, **session_options
        For a model given as a path or bytes: the :class:`~xpuruntime.InferenceSession` made of it.

    Raises
    ------
    UnsupportedOperationError
        The model is not a decoder the generator recognises (no ``input_ids``, a cache input without its present
        output, hidden states instead of logits, ...), or ``config.cache == "required"`` and it has no cache.
    """

    def __init__(self, model: Union[str, Path, bytes, InferenceSession], config: Optional[GenerationConfig] = None,
                 *, device: Any = "cpu", engine: str = "auto", **session_options: Any) -> None:
        self.session, self.config = _session_and_config(model, config, device, engine, session_options)
        self._generator = _core.Generator(self.session._session, self.config)

    @property
    def uses_cache(self) -> bool:
        """Whether generations feed the model's cache (it has one and ``config.cache`` is not ``"none"``)."""
        return self._generator.uses_cache

    @property
    def signature(self) -> str:
        """What the generator recognised: the inputs it feeds, the logits, the cache's layers and shapes."""
        return self._generator.signature

    @property
    def cache_layout(self) -> str:
        """The cache layout in use, ``config.cache_layout`` with "auto" resolved: "static" or "dynamic"."""
        return self._generator.cache_layout

    def generate(self, input_ids: Prompts) -> Union[List[int], List[List[int]]]:
        """The new tokens: a list for one prompt (1-D ``input_ids``), a list per row for a batch."""
        rows, single = _as_batch(input_ids)
        tokens = self._generator.generate(rows)
        return tokens[0] if single else tokens

    def stream(self, input_ids: Prompts) -> Iterator[Union[int, List[Optional[int]]]]:
        """Yields tokens as each step makes them: an int per step for one prompt; for a batch, a list with one
        entry per row (None for a row that has ended)."""
        rows, single = _as_batch(input_ids)
        generation = self._generator.start(rows)
        while not generation.done:
            step = generation.step()
            if single:
                yield step[0]
            else:
                yield step

    def start(self, input_ids: Prompts) -> _core.Generation:
        """A generation to step by hand: ``step()`` until ``done``; ``tokens``, ``steps``, ``cache_bytes``,
        ``stats`` (prefill and decode times, tokens/s, the cache's occupancy: a ``GenerationStats``)."""
        rows, _ = _as_batch(input_ids)
        return self._generator.start(rows)

    def __repr__(self) -> str:
        return f"Generator({self.signature}, {self.config!r}, engine={self.session.engine!r})"


PagedCacheConfig = _core.PagedCacheConfig
PagedCacheConfig.__doc__ = """How a :class:`ContinuousBatcher` holds its requests' caches (keyword arguments only).

Parameters
----------
max_batch : int
    Requests decoded together at most (default 8).
block_size : int
    Positions per cache block (default 16).
num_blocks : int
    Blocks in the pool, allocated once on the session's device; 0 (default): ``max_batch`` x the blocks of 1024
    positions.
share_prefixes : bool
    A prompt's full blocks equal to those of a request already in the pool are shared, not recomputed (default True).
reservation : str
    When a request takes its blocks. ``"on_demand"`` (default): its prompt's at admission and one more whenever
    decoding fills a block; when the pool has none free, the request submitted last is preempted and, once admitted
    again, its prompt and the tokens it made are prefilled again (``stats.preemptions``, ``stats.recomputed_tokens``).
    ``"whole_length"``: the blocks of its prompt plus its new-token limit at admission, never preempted (fewer
    requests run at once).
"""


class ContinuousBatcher:
    """Serves many generation requests with one decoder session: requests join the running batch between decode
    steps and leave it when they finish; their caches live in a pool of fixed-size blocks (docs/generation.md,
    "Continuous batching").

    Parameters
    ----------
    model : str, Path, bytes or InferenceSession
        A decoder with a cache and an ``attention_mask`` input.
    config : GenerationConfig, optional
        The requests' default config (each ``submit`` may give its own).
    cache : PagedCacheConfig, optional
        The batch size and the block pool.
    device, engine, **session_options
        For a model given as a path or bytes.

    Examples
    --------
    >>> batcher = ContinuousBatcher("decoder.onnx", GenerationConfig(max_new_tokens=16),
    ...                             PagedCacheConfig(max_batch=4, block_size=8))
    >>> a = batcher.submit([1, 2, 3]); b = batcher.submit([4, 5])
    >>> while not batcher.idle:
    ...     for event in batcher.step():          # BatchEvent(request, token, finished)
    ...         print(event.request, event.token)
    >>> batcher.tokens(a), batcher.stats
    """

    def __init__(self, model: Union[str, Path, bytes, InferenceSession], config: Optional[GenerationConfig] = None,
                 cache: Optional[PagedCacheConfig] = None, *, device: Any = "cpu", engine: str = "auto",
                 **session_options: Any) -> None:
        self.session, self.config = _session_and_config(model, config, device, engine, session_options)
        self._batcher = _core.ContinuousBatcher(self.session._session, self.config,
                                                cache if cache is not None else PagedCacheConfig())

    def submit(self, prompt: Sequence[int], config: Optional[GenerationConfig] = None) -> int:
        """Queues a request; returns its id. It starts at a later :meth:`step`."""
        rows, single = _as_batch(prompt)
        if not single:
            raise _core.InvalidTypeError("submit takes one prompt (a list of token ids); submit a batch one by one")
        return self._batcher.submit(rows[0], config)

    def step(self) -> List[_core.BatchEvent]:
        """Admits what fits, prefills it, runs one decode step; the tokens made (``BatchEvent``)."""
        return self._batcher.step()

    def run(self) -> "dict[int, List[int]]":
        """Steps until every request has finished; the tokens of each request by id."""
        return dict(self._batcher.run())

    def stream(self) -> Iterator[_core.BatchEvent]:
        """Yields every token as the steps make them, until idle (requests submitted meanwhile are served too)."""
        while not self._batcher.idle:
            for event in self._batcher.step():
                yield event

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing running."""
        return self._batcher.idle

    def finished(self, request: int) -> bool:
        return self._batcher.finished(request)

    def tokens(self, request: int) -> List[int]:
        """The request's new tokens so far."""
        return self._batcher.tokens(request)

    @property
    def stats(self) -> _core.BatcherStats:
        """Requests waiting / running / finished, prefill and decode tokens and times, the pool's blocks in use."""
        return self._batcher.stats

    def explain(self) -> str:
        """What the batcher holds: the pool (blocks, bytes, in use, shared) and every waiting and running request with
        its length, the positions its blocks hold and its block table."""
        return self._batcher.explain()

    @property
    def cache_config(self) -> PagedCacheConfig:
        return self._batcher.cache_config

    def __repr__(self) -> str:
        return f"ContinuousBatcher({self._batcher.signature}, {self.cache_config!r})"


__all__ = ["ContinuousBatcher", "DECODE_RANGE", "GenerationConfig", "Generator", "PagedCacheConfig", "PREFILL_RANGE"]
