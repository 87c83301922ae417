"""The CUDA path on a real GPU, checked and timed in one run (the GPU kernels cannot run on CPU).

    python bench/gpu.py [--sections attention,moe,train,decode] [--batches 1,32,128]
                        [--new-tokens 128] [--runs 3] [--decode-dots ynnpack] [--quick]

attention: cuDNN flash attention (what `model.attention=auto` picks on GPU in bf16) against
  our XLA attention on causal GQA with left padding, in bfloat16: the largest error of each
  against a float32 evaluation of the same inputs, for the output and the q/k/v gradients.
moe: the routed MoE (its tiled grouped matmul on GPU) against the dense reference in float32 at
  highest matmul precision, forward and gradients, with one expert that gets every token.
train: the real PPO train step on SmolLM2-135M's shapes (bf16 compute) with each kernel, one
  kernel's loss and gradient norm against the other's, and tokens/s.
decode: greedy decode against `transformers` `generate` on the same device with the same
  random SmolLM2-135M weights (written by `save_hf`), EOS ignored: tokens/s per batch and the
  share of generated tokens that agree. bf16 on GPU, float32 on CPU. On CPU, --decode-dots
  (e.g. ynnpack,emitter) times ours once per way of compiling the decode's dots
  (`spade_jax.sampling.DecodeDots`), their runs interleaved as in bench/sampler.py.

Weights are random because the embedded GGUF does not travel to the GPU machine; the shapes
are SmolLM2-135M-Instruct's, so the timings are the real model's. With JAX_PLATFORMS=cpu the
sections run on the CPU without the cuDNN kernel (the decode comparison on another machine's
CPU); `--quick` shrinks every shape for a dry run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import traceback

from sampler import (  # bench/sampler.py: this script's folder is on sys.path
    cpu_model,
    decode_dots_list,
    timed,
    timed_interleaved,
)

SECTIONS = ("attention", "moe", "train", "decode")


def check(ok: bool, message: str) -> None:
    """A correctness check of this script: it stops with `message` when `ok` is false (an
    assert would vanish under python -O)."""
    if not ok:
        raise SystemExit(f"error: {message}")


def smollm2_shapes(quick: bool):
    from spade_jax.models.config import ModelConfig

    return ModelConfig(vocab_size=49152, d_model=576, n_layers=4 if quick else 30, n_heads=9,
                       n_kv_heads=3, head_dim=64, ffn_dim=1536, rope_theta=100000.0,
                       rms_eps=1e-5, tie_embeddings=True, max_position=8192, family="llama")


def max_error(x, reference, valid=None) -> float:
    """Largest |x - reference| over `valid` entries, relative to the reference's largest."""
    import numpy as np

    x, reference = np.asarray(x, np.float32), np.asarray(reference, np.float32)
    if valid is not None:
        valid = np.broadcast_to(valid, x.shape)
        x, reference = x[valid], reference[valid]
    return float(np.abs(x - reference).max() / np.abs(reference).max())


def check_attention(quick: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from spade_jax.models.attention import SlotMask, attention

    gpu = jax.default_backend() == "gpu"
    kernels = ("cudnn", "xla") if gpu else ("xla",)
    shapes = [(2, 64, 4, 2, 64)] if quick else [(4, 1024, 9, 3, 64), (2, 2047, 32, 4, 128)]
    for batch, length, heads, kv_heads, head_dim in shapes:
        keys = jax.random.split(jax.random.key(length), 4)
        q = jax.random.normal(keys[0], (batch, length, heads, head_dim))
        k_t = jax.random.normal(keys[1], (batch, kv_heads, head_dim, length))
        v = jax.random.normal(keys[2], (batch, kv_heads, length, head_dim))
        pads = np.arange(batch) * (length // 5)  # row r has r * length/5 left-padding slots
        valid = np.arange(length)[None] >= pads[:, None]
        # as in training, where the loss masks padding: padded queries get no cotangent
        cotangent = jax.random.normal(keys[3], (batch, length, heads, head_dim)) * valid[
            :, :, None, None]
        mask = SlotMask(jnp.asarray(valid), 0)

        def outputs(kernel, dtype, q=q, k_t=k_t, v=v, cotangent=cotangent, mask=mask):
            def loss(q, k_t, v):
                out = attention(q, k_t, v, mask, causal=True, kernel=kernel)
                return jnp.sum(out.astype(jnp.float32) * cotangent), out

            cast = [a.astype(dtype) for a in (q, k_t, v)]
            grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(*cast)
            return (out, *grads)

        bf16 = tuple(a.astype(jnp.bfloat16).astype(jnp.float32) for a in (q, k_t, v))
        with jax.default_matmul_precision("highest"):
            reference = outputs("xla", jnp.float32, *bf16)
        # padded queries' outputs are unspecified
        names = ("out", "dq", "dk", "dv")
        masks = (valid[:, :, None, None], None, None, None)
        print(f"attention B={batch} T={length} H={heads} K={kv_heads} Dh={head_dim}, bf16, "
              f"left padding {pads.tolist()}; error relative to the largest f32 value:")
        for kernel in kernels:
            got = outputs(kernel, jnp.bfloat16)
            errors = [max_error(g, r, m) for g, r, m in zip(got, reference, masks, strict=True)]
            print(f"  {kernel:5s} " + "  ".join(
                f"{n} {e:.2e}" for n, e in zip(names, errors, strict=True)))
            check(max(errors) < 0.05, f"{kernel} attention is off: {errors}")
        if gpu:
            cudnn = jax.jit(lambda q, k, v, mask=mask: attention(q, k, v, mask, causal=True,
                                                                 kernel="cudnn"))
            text = cudnn.lower(*(a.astype(jnp.bfloat16) for a in (q, k_t, v))).compile().as_text()
            check("__cudnn$fmha" in text, "the cudnn kernel did not compile to cuDNN's fmha")
            print("  compiled program calls cuDNN:", sorted(set(
                w for w in text.replace('"', " ").split() if w.startswith("__cudnn$fmha"))))


def check_moe(quick: bool) -> None:
    import jax
    import jax.numpy as jnp

    from spade_jax.models import moe

    d, f, e, k, n = (64, 32, 8, 2, 96) if quick else (2048, 768, 128, 8, 512)
    keys = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(keys[0], (2, n // 2, d))
    router = jax.random.normal(keys[1], (d, e)) * 0.02
    router = router.at[:, 3].add(5.0)  # expert 3 is in every token's top-k
    gate, up = (jax.random.normal(keys[i], (e, d, f)) * 0.02 for i in (2, 3))
    down = jax.random.normal(keys[4], (e, f, d)) * 0.02
    cotangent = jax.random.normal(keys[5], x.shape)

    def run(fn):
        def loss(*operands):
            out = fn(*operands, top_k=k, normalise=True)
            out = out[0] if isinstance(out, tuple) else out
            return jnp.sum(out * cotangent), out

        grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(
            x, router, gate, up, down)
        return (out, *grads)

    with jax.default_matmul_precision("highest"):
        routed, dense = run(moe.moe_mlp), run(moe.moe_mlp_dense)
    names = ("out", "dx", "drouter", "dgate", "dup", "ddown")
    errors = [max_error(a, b) for a, b in zip(routed, dense, strict=True)]
    print(f"moe D={d} F={f} E={e} top-{k}, {n} tokens, f32: routed vs dense, error relative to "
          "the largest dense value:")
    print("  " + "  ".join(f"{name} {err:.1e}" for name, err in zip(names, errors, strict=True)))
    check(max(errors) < 1e-4, f"routed MoE differs from dense: {errors}")


def train_tokens_per_s(kernel: str, quick: bool, runs: int) -> tuple[float, dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from spade_jax.models.transformer import Transformer
    from spade_jax.rl.trainer import TrainConfig, TrainStep, init_train_state, make_optimizer
    from spade_jax.sharding import make_mesh

    cfg = smollm2_shapes(quick).replace(attention=kernel)
    b, t = (2, 128) if quick else (16, 2048)
    rng = np.random.default_rng(0)
    batch = dict(tokens=rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32),
                 loss_mask=np.ones((b, t), np.float32),
                 advantages=rng.normal(size=b).astype(np.float32),
                 behaviour_logp=np.full((b, t), -10.0, np.float32))
    config = TrainConfig(learning_rate=1e-5)
    optimizer = make_optimizer(config)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    state = {"s": init_train_state(model, optimizer, mesh)}
    step = TrainStep(cfg, optimizer, mesh, config, compute_dtype=jnp.bfloat16)
    first = {}

    def one():
        state["s"], metrics = step(state["s"], batch)
        jax.block_until_ready(metrics)
        first.setdefault("metrics", jax.device_get(metrics))

    seconds = timed(one, runs)
    return b * t / seconds, first["metrics"]


def check_train(quick: bool, runs: int) -> None:
    import jax

    kernels = ("cudnn", "xla") if jax.default_backend() == "gpu" else ("xla",)
    results = {kernel: train_tokens_per_s(kernel, quick, runs) for kernel in kernels}
    print("train step, SmolLM2-135M shapes, bf16 compute, PPO-clip + AdamW:")
    for kernel, (tps, metrics) in results.items():
        print(f"  {kernel:5s} {tps:9.0f} tok/s  loss {float(metrics['loss']):+.6f}  "
              f"grad_norm {float(metrics['grad_norm']):.6f}")
    if len(results) == 2:
        (a, ma), (b, mb) = results["cudnn"], results["xla"]
        print(f"  cudnn / xla: {a / b:.2f}x")
        check(abs(float(ma["grad_norm"]) / float(mb["grad_norm"]) - 1) < 0.02,
              f"cudnn and xla train steps' grad norms differ: {ma['grad_norm']} {mb['grad_norm']}")


def check_decode(quick: bool, batches: list[int], new_tokens: int, runs: int,
                 decode_dots: list) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from spade_jax.models.transformer import Transformer
    from spade_jax.sampling.sampler import Sampler
    from spade_jax.weights.safetensors_io import save_hf

    gpu = jax.default_backend() == "gpu"
    dtype, torch_dtype = ((jnp.bfloat16, torch.bfloat16) if gpu else (jnp.float32, torch.float32))
    device = "cuda" if gpu else "cpu"
    cfg = smollm2_shapes(quick)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    with tempfile.TemporaryDirectory() as directory:
        save_hf(model, directory)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch_dtype).to(device).eval()
    samplers = {dots: Sampler(model, compute_dtype=dtype, decode_dots=dots)
                for dots in decode_dots}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, 40 + 7 * (i % 4)).tolist() for i in range(256)]
    print(f"decode on {jax.devices()[0].device_kind} ({device}), {jnp.dtype(dtype).name}, "
          f"{new_tokens} new tokens, EOS ignored; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), jax {jax.__version__}")
    print(f"  {'batch':>5} {'decode dots':>11} {'ours tok/s':>11} {'HF tok/s':>9} {'ratio':>6} "
          f"{'agree':>6}")
    for batch in batches:
        rows = prompts[:batch]

        def ours(sampler, rows=rows):
            session = sampler.start(rows, capacity=max(map(len, rows)) + new_tokens)
            return [turn.tokens for turn in session.decode(new_tokens)]

        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows],
                                      device=device)

        def baseline(ids=ids, attention_mask=attention_mask, width=width):
            with torch.no_grad():
                out = hf.generate(input_ids=ids, attention_mask=attention_mask, do_sample=False,
                                  min_new_tokens=new_tokens, max_new_tokens=new_tokens,
                                  pad_token_id=0)
            if gpu:
                torch.cuda.synchronize()
            return out[:, width:].tolist()

        ours_s = timed_interleaved({"transformers": baseline} | {
            dots: lambda s=sampler: ours(s) for dots, sampler in samplers.items()}, runs)
        hf_tps = batch * new_tokens / ours_s.pop("transformers")
        reference = baseline()
        for dots, sampler in samplers.items():
            agree = np.mean([a == b for x, y in zip(ours(sampler), reference, strict=True)
                             for a, b in zip(x, y, strict=True)])
            ours_tps = batch * new_tokens / ours_s[dots]
            print(f"  {batch:>5} {dots.value:>11} {ours_tps:>11.1f} {hf_tps:>9.1f} "
                  f"{ours_tps / hf_tps:>5.2f}x {agree:>6.0%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--decode-dots", default="ynnpack", type=decode_dots_list,
                        help="decode section: comma-separated DecodeDots values (CPU only)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a dry run on CPU)")
    args = parser.parse_args()
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; use some of {SECTIONS}")

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}); "
          f"host CPU: {cpu_model()}, {os.cpu_count()} cores", flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    failed = []
    for name in sections:
        start = time.perf_counter()
        try:
            if name == "attention":
                check_attention(args.quick)
            elif name == "moe":
                check_moe(args.quick)
            elif name == "train":
                check_train(args.quick, args.runs)
            else:
                check_decode(args.quick, batches, args.new_tokens, args.runs, args.decode_dots)
        except Exception:  # one section's failure must not hide the others' results
            traceback.print_exc()
            failed.append(name)
        print(f"[{name}: {time.perf_counter() - start:.0f} s]", flush=True)
    if failed:
        raise SystemExit(f"failed sections: {failed}")


if __name__ == "__main__":
    main()
