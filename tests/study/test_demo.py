"""The miniature study end to end on tiny settings: warm start, two methods, table, plots."""

import json

from experiments.configs import demo


def test_demo_writes_the_table_plots_and_results(tmp_path, capsys):
    from gdro_jax.study import run_demo

    config = demo.get_config()
    config.methods = "grpo,gdro_both"
    config.progress = False
    task = dict(num_levels=6, pool_size=48, validation_per_level=2, test_per_level=3)
    model = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)
    config.pretrain.task.update(task)
    config.pretrain.model.update(model)
    config.pretrain.train.update(steps=20, batch_size=16, warmup_steps=2)
    config.pretrain.eval.update(num_samples=2, batch_size=12)
    config.train.task.update(task)
    config.train.model.update(model)
    config.train.update(steps=3, num_prompts=4, max_new_tokens=36, tensorboard=False)
    config.eval.update(num_samples=2, batch_size=18)

    out = run_demo(config, tmp_path)

    assert list(out["results"]) == ["warm_start", "grpo", "gdro_both"]
    for name in ("table.txt", "results.json", "reward.png", "pass_at_2.png", "curriculum.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = (tmp_path / "table.txt").read_text()
    assert "pooled" in table and "gdro_both pass@2" in table
    for level in range(1, 7):
        assert f"L{level}" in table
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["results"]) == {"warm_start", "grpo", "gdro_both"}
    assert results["sampled_tokens"]["grpo"] > 0
    for method in ("grpo", "gdro_both"):
        rows = (tmp_path / method / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 3
        assert (tmp_path / method / "eval.json").exists()
    assert "held-out test split" in capsys.readouterr().out
