"""Train-step throughput: spade_jax PPO step vs a PyTorch step on the same model (same run).

    python bench/train_step.py [--batch 8] [--seq 256] [--runs 3] [--remat]

SmolLM2-135M-Instruct, float32, 2 threads. Ours: chunked log-probs + PPO-clip loss + backward
+ global-norm clip + AdamW (the real RL step). Baseline: transformers forward with labels
(full logits, cross-entropy) + backward + torch AdamW + zero_grad. tokens/s = batch x seq /
median step time over --runs after one warm-up (which compiles ours).

Also printed, as context rather than a baseline: the "matmul bound", the step time of only the
model's projection, MLP and unembedding matmuls, forward and backward (dX and dW), with the same
shapes (no attention, norms, softmax, recomputation or optimizer), i.e. what XLA's CPU matrix
products allow this step here; `pytorch s/step / bound s/step` is the ratio no f32 XLA step can
beat on this machine. Like the sampler's, it is timed under both of XLA:CPU's dot paths
(`sampler.fastest_matmul_path`) and the faster is reported (ours uses XLA's default, YNNPACK).
"""

from __future__ import annotations

import argparse
import os

from sampler import fastest_matmul_path, timed  # bench/sampler.py


def matmul_bound(model, batch: int, seq: int, runs: int) -> tuple[float, str]:
    """Seconds per forward + backward of the model's weight matmuls alone (see the module doc)."""
    import jax
    import jax.numpy as jnp

    from spade_jax.models.layers import vocab_logits

    weights = [{name: value for name, value in layer.items()
                if name in ("wqkv", "wo", "w_gate_up", "w_down")}
               for layer in model.layer_params(fuse=True)]
    n_q = model.cfg.n_heads * model.cfg.head_dim
    embed, vocab_major = model.output_projection()

    def loss(weights, embed, x):
        for p in weights:
            x = x + p["wo"](p["wqkv"](x)[:, :n_q])
            gate, up = jnp.split(p["w_gate_up"](x), 2, axis=-1)
            x = x + p["w_down"](gate * up)
        return jnp.sum(vocab_logits(x, embed, vocab_major))

    x = jnp.ones((batch * seq, model.cfg.d_model), embed.dtype)
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(weights, embed, x)
    return fastest_matmul_path(lowered, (weights, embed, x), runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--remat", action="store_true")
    args = parser.parse_args()

    import jax
    import numpy as np
    import torch
    import transformers

    import spade_jax
    from spade_jax.rl.trainer import Remat, TrainConfig, TrainStep, init_train_state, make_optimizer
    from spade_jax.sharding import make_mesh

    torch.set_num_threads(2)
    b, t = args.batch, args.seq
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 49152, (b, t)).astype(np.int32)

    policy = spade_jax.load_policy("smollm2-135m-instruct")
    config = TrainConfig(learning_rate=1e-5, remat=Remat.BLOCK if args.remat else Remat.NONE)
    optimizer = make_optimizer(config)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    state = {"s": init_train_state(policy.model, optimizer, mesh)}
    step = TrainStep(policy.config, optimizer, mesh, config)
    batch = dict(tokens=tokens, loss_mask=np.ones((b, t), np.float32),
                 advantages=rng.normal(size=b).astype(np.float32),
                 behaviour_logp=np.full((b, t), -10.0, np.float32))

    def ours():
        state["s"], metrics = step(state["s"], batch)
        jax.block_until_ready(metrics)

    from spade_jax.weights.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).train()
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-5, betas=(0.9, 0.98), weight_decay=0.1)
    ids = torch.from_numpy(tokens.astype(np.int64))

    def baseline():
        loss = hf(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        torch_opt.step()
        torch_opt.zero_grad()

    print(f"load average {os.getloadavg()[0]:.2f} (2 cores; other work skews the figures)")
    # before the step donates the weights
    bound_s, bound_path = matmul_bound(policy.model, b, t, args.runs)
    ours_s = timed(ours, args.runs)
    hf_s = timed(baseline, args.runs)
    print(f"ours    {ours_s:7.2f} s/step  {b * t / ours_s:7.1f} tok/s")
    print(f"pytorch {hf_s:7.2f} s/step  {b * t / hf_s:7.1f} tok/s")
    print(f"ratio   {hf_s / ours_s:.2f}x   (load average {os.getloadavg()[0]:.2f})")
    print(f"matmul bound {bound_s:7.2f} s/step ({bound_path} dots): ours at "
          f"{bound_s / ours_s:.0%} of it; no step above {hf_s / bound_s:.2f}x pytorch here")


if __name__ == "__main__":
    main()
