"""How often does an untrained SmolLM2-135M-Instruct, as Designer, write a valid environment?

    python bench/designer_validity.py [--n 50] [--batch 5] [--out docs/designer_validity.json]

The Designer's real path, minus training: the prompts of `spade_jax.spade.prompts` (skills
round-robin over the configured game skills, a grounding document from the `stdlib` corpus,
no memory block, the seed worked example), generation with the SPADE sampler at the
`configs/smollm2_135m.py` settings (Designer temperature and max new tokens), and every design
through the validation gate `spade_jax.envs.validate` in the sandbox. Prints the valid-design
rate and the failures by first failing check (V0..V7), and writes them as JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="designs to generate")
    parser.add_argument("--batch", type=int, default=5, help="designs generated at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="smollm2_135m")
    parser.add_argument("--max-new-tokens", type=int, default=0,
                        help="override the config's designer_max_new_tokens (0: keep)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "designer_validity.json"))
    args = parser.parse_args()

    import jax
    import numpy as np

    from spade_jax import config as config_lib
    from spade_jax.envs import EnvPool, validate
    from spade_jax.envs.seeds import list_seed_envs
    from spade_jax.policy import load_policy
    from spade_jax.sampling.sampler import Sampler
    from spade_jax.sharding import make_mesh
    from spade_jax.spade import prompts
    from spade_jax.spade.corpus import load_corpus
    from spade_jax.spade.loop import active_skills
    from spade_jax.spade.rollout import ChatFormat

    run = config_lib.parse(config_lib.load_config_file(args.config), jax.device_count())
    s, smp = run.spade, run.sampling
    max_new_tokens = args.max_new_tokens or smp.designer_max_new_tokens
    started = time.perf_counter()
    mesh = make_mesh(run.mesh.shape(jax.device_count()))
    policy = load_policy(run.model.source, mesh=mesh, dtype=run.model.param_dtype)
    sampler = Sampler(policy.model, mesh=mesh)
    chat = ChatFormat(policy.tokenizer)
    corpus = load_corpus(run.corpus.source, max_words=run.corpus.max_words)
    example = prompts.worked_example(list_seed_envs(), s.game_type)
    pool = EnvPool(run.sandbox, warm=4, max_turns=s.max_turns)
    load_s = time.perf_counter() - started
    rng = np.random.default_rng(args.seed)
    skills = active_skills(list(s.skills), len(s.skills), 0)

    designs, generate_s, validate_s = [], 0.0, 0.0
    try:
        for first in range(0, args.n, args.batch):
            count = min(args.batch, args.n - first)
            slots = []
            for i in range(first, first + count):
                document = corpus.sample(rng)
                skill = skills[i % len(skills)]
                messages = prompts.designer_messages(
                    skill=skill, document=document.text, memory=None, example_code=example,
                    max_turns=s.max_turns, game_type=s.game_type)
                slots.append((skill, document.doc_id, chat.prompt(messages)))
            t0 = time.perf_counter()
            prompt_ids = [ids for _, _, ids in slots]
            session = sampler.start(prompt_ids,
                                    capacity=max(map(len, prompt_ids)) + max_new_tokens + 1)
            outputs = session.decode(max_new_tokens, temperature=smp.designer_temperature,
                                     stop_token_ids=[chat.eos_id], seed=int(rng.integers(2**31)))
            t1 = time.perf_counter()
            for (skill, doc_id, ids), out in zip(slots, outputs, strict=True):
                text = policy.tokenizer.decode(out.tokens, skip_special_tokens=True)
                report = validate(text, max_turns=s.max_turns, pool=pool)
                check = report.failures[0][0] if report.failures else None
                designs.append({
                    "skill": skill, "doc_id": doc_id, "prompt_tokens": len(ids),
                    "new_tokens": len(out.tokens), "finish": out.finish_reason,
                    "valid": report.ok, "failed_check": check,
                    "message": (report.failures[0][1].replace(str(ROOT), ".")[:300]
                                if report.failures else ""),
                })
            t2 = time.perf_counter()
            generate_s += t1 - t0
            validate_s += t2 - t1
            valid = sum(d["valid"] for d in designs)
            print(f"{len(designs)}/{args.n} designs, {valid} valid "
                  f"(generate {t1 - t0:.0f} s, validate {t2 - t1:.1f} s)", flush=True)
    finally:
        pool.shutdown()

    failures = collections.Counter(d["failed_check"] for d in designs if not d["valid"])
    result = {
        "model": run.model.source, "config": args.config, "n": len(designs),
        "valid": sum(d["valid"] for d in designs),
        "valid_rate": float(np.mean([d["valid"] for d in designs])) if designs else 0.0,
        "failures_by_check": dict(sorted(failures.items())),
        "settings": {"temperature": smp.designer_temperature,
                     "max_new_tokens": max_new_tokens, "max_turns": s.max_turns,
                     "corpus": run.corpus.source, "max_words": run.corpus.max_words,
                     "memory": False, "batch": args.batch, "seed": args.seed},
        "seconds": {"load": round(load_s, 1), "generate": round(generate_s, 1),
                    "validate": round(validate_s, 1)},
        "designs": designs,
    }
    print(f"valid designs: {result['valid']}/{result['n']} ({result['valid_rate']:.0%})")
    for check, count in result["failures_by_check"].items():
        print(f"  first failure {check}: {count}")
    print(f"time: load {load_s:.0f} s, generate {generate_s:.0f} s, validate {validate_s:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
