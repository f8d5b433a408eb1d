"""`python -m dmuon bench e2e --fake-world D` on the CPU (dmuon's tiny GPT under FSDP2 over
the fake backend): FSDP2's collectives counted exactly (bytes from the model's shards),
HSDP's all-reduce, the projected table, bad arguments."""

from __future__ import annotations

import json
import re

import pytest

from dmuon.cli.main import main

_TINY = ["bench", "e2e", "--model", "tiny", "--device", "cpu", "--seq", "16", "--steps", "1", "--warmup", "1",
         "--micro-batch", "1"]


def _padded_bytes(params, world: int) -> int:
    """float32 bytes of `params` with dim 0 padded to a multiple of the world (FSDP2's shards)."""
    total = 0
    for p in params:
        rest = p.numel() // p.shape[0]
        total += -(-p.shape[0] // world) * world * rest * 4
    return total


def _tiny_units() -> tuple[list, list]:
    """The tiny GPT's parameters per FSDP2 unit: the decoder blocks, and the rest (the root)."""
    from dmuon.cli.bench.e2e_models import model_spec

    spec = model_spec("tiny", 16)
    model = spec.build()
    blocks = spec.blocks(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    return [list(b.parameters()) for b in blocks], [p for p in model.parameters() if id(p) not in in_blocks]


def test_one_rank_of_a_fake_world_counts_fsdp2s_collectives_and_projects_each_optimizer(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main([*_TINY, "--fake-world", "4", "--rank", "2", "--optimizers", "dmuon,gather,adamw",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--fake-world 4, rank 2" in printed and "step projected" in printed
    record = json.loads(out.read_text())
    assert record["world"] == 4 and record["rank"] == 2
    blocks, root = _tiny_units()
    by_kind = record["fsdp"]["by_kind"]
    # One reduce-scatter per unit of its padded float32 gradients; the blocks' weights are
    # gathered in forward and again in backward (they reshard after forward), the root's once.
    assert by_kind["reduce_scatter"]["count"] == len(blocks) + 1
    assert by_kind["reduce_scatter"]["bytes"] == _padded_bytes([p for b in blocks for p in b] + root, 4)
    assert by_kind["all_gather"]["count"] == 2 * len(blocks) + 1
    assert by_kind["all_gather"]["bytes"] == _padded_bytes([p for b in blocks for p in b] * 2 + root, 4)
    assert set(by_kind) == {"all_gather", "reduce_scatter"} and by_kind["all_gather"]["group_sizes"] == [4]
    optimizers = record["optimizers"]
    assert set(optimizers) == {"dmuon", "gather", "adamw"}
    for name, o in optimizers.items():
        # NOTE: forward + backward without the fake world's own work (the gradient overwrite).
        assert o["fwd_bwd_ms"] >= o["fwd_bwd_compute_ms"] > 0 and o["sanitize_ms"] > 0, name
        assert o["fwd_bwd_projected_ms"] >= o["fwd_bwd_compute_ms"], name
        assert o["sanitized_groups"] == len(blocks) + 1, name
        assert o["projected_step_ms"] == pytest.approx(o["fwd_bwd_projected_ms"] + o["opt_left_after_backward_ms"]), name
    # NOTE: world 4, auto: the library's default, the step after backward (measured).
    assert not any(o["backward_step"] for o in optimizers.values())
    assert optimizers["adamw"]["opt_left_after_backward_ms"] == optimizers["adamw"]["opt_ms"]
    # DMuon's exchange was simulated from this rank's pipeline; AdamW's step has none.
    assert optimizers["dmuon"]["muon"]["simulated_s"] > 0 and optimizers["dmuon"]["muon"]["bytes_sent"] > 0
    assert optimizers["adamw"]["opt_projected_ms"] == optimizers["adamw"]["opt_ms"]
    assert "latency + bytes / bandwidth" in record["projection_model"]


def test_hsdp_adds_the_replicas_all_reduce(tmp_path):
    out = tmp_path / "hsdp.json"
    assert main([*_TINY, "--fake-world", "4", "--hsdp", "2", "--optimizers", "adamw", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    by_kind = record["fsdp"]["by_kind"]
    assert record["mesh"] == {"replicas": 2, "shards": 2}
    assert by_kind["all_gather"]["group_sizes"] == [2] and by_kind["all_reduce"]["group_sizes"] == [2]
    blocks, root = _tiny_units()
    # The all-reduce across replicas carries each rank's reduce-scattered shard (1/2).
    assert by_kind["all_reduce"]["bytes"] == _padded_bytes([p for b in blocks for p in b] + root, 2) // 2


@pytest.mark.parametrize("argv, message", [
    (["--fake-world", "2", "--world", "2"], "cannot be combined with --world"),
    (["--fake-world", "2", "--rank", "2"], r"--rank 2 is outside the fake world of 2 \(ranks 0..1\)"),
    (["--fake-world", "0"], "--fake-world must be >= 1"),
    (["--rank", "1"], "--rank needs --fake-world"),
    (["--order", "turns"], r"--order needs --fake-world \(a real --world trains one optimizer after the other\)"),
    (["--fake-world", "2", "--order", "random"], None),
])
def test_bad_arguments_name_the_argument(argv, message, capsys):
    if message is None:  # NOTE: refused by argparse, which names the argument and exits
        with pytest.raises(SystemExit):
            main([*_TINY, *argv])
        assert "--order: invalid choice: 'random'" in capsys.readouterr().err
        return
    with pytest.raises(ValueError, match=message):
        main([*_TINY, *argv])


def _spy_on_the_steps(monkeypatch) -> list:
    """("built", name) when an optimizer's model is built, ("step", name, timed, counting)
    for each of its steps, in order."""
    from dmuon.cli.bench import e2e_fake

    events = []
    init, step = e2e_fake._FakeRankTrainer.__init__, e2e_fake._FakeRankTrainer.step

    def spy_init(self, name, *args, **kwargs):
        init(self, name, *args, **kwargs)
        events.append(("built", name))

    def spy_step(self, timed, counting=False):
        events.append(("step", self.name, timed, counting))
        return step(self, timed, counting)

    monkeypatch.setattr(e2e_fake._FakeRankTrainer, "__init__", spy_init)
    monkeypatch.setattr(e2e_fake._FakeRankTrainer, "step", spy_step)
    return events


def test_optimizers_train_in_turns_by_default_with_the_order_rotated_every_step(tmp_path, capsys, monkeypatch):
    events = _spy_on_the_steps(monkeypatch)
    out = tmp_path / "turns.json"
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon,adamw", "--warmup", "1", "--steps", "2",
                 "--json", str(out)]) == 0
    assert "optimizers in turns (one step each, order rotated)" in capsys.readouterr().out
    # Both models alive before the first step; then one step of each per round, the first
    # one moved to the back every round (warm-up untimed); then each counting step.
    assert events == [("built", "dmuon"), ("built", "adamw"),
                      ("step", "dmuon", False, False), ("step", "adamw", False, False),
                      ("step", "adamw", True, False), ("step", "dmuon", True, False),
                      ("step", "dmuon", True, False), ("step", "adamw", True, False),
                      ("step", "dmuon", False, True), ("step", "adamw", False, True)]
    record = json.loads(out.read_text())
    assert record["config"]["order"] == "turns"
    for name in ("dmuon", "adamw"):
        o = record["optimizers"][name]
        assert o["fwd_bwd_ms"] > 0 and o["opt_ms"] > 0 and o["sanitize_ms"] > 0, name


def test_sequential_order_trains_one_optimizer_after_the_other(tmp_path, capsys, monkeypatch):
    events = _spy_on_the_steps(monkeypatch)
    out = tmp_path / "sequential.json"
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon,adamw", "--warmup", "1", "--steps", "1",
                 "--order", "sequential", "--json", str(out)]) == 0
    assert "one optimizer after the other" in capsys.readouterr().out
    assert events == [("built", "dmuon"), ("step", "dmuon", False, False), ("step", "dmuon", True, False),
                      ("step", "dmuon", False, True),
                      ("built", "adamw"), ("step", "adamw", False, False), ("step", "adamw", True, False),
                      ("step", "adamw", False, True)]
    assert json.loads(out.read_text())["config"]["order"] == "sequential"


def test_the_weight_ownership_mode_is_refused_by_name(tmp_path):
    with pytest.raises(RuntimeError, match="weight-ownership mode .* cannot run over torch's fake"):
        main([*_TINY, "--fake-world", "2", "--optimizers", "dmuon-ownership"])


def _spy_on_the_hooks(monkeypatch) -> list:
    """Events in order: ("sanitized", ids) from the bench's overwrite, ("final", ids, sane)
    when DMuon's backward-step hook reads a group (sane: every gradient it reads finite and
    of the overwrite's size)."""
    from dmuon import distributed
    from dmuon.backward_step import BackwardStep
    from dmuon.cli.bench import fake_grads

    events = []
    sanitize, params_final = fake_grads.sanitize_gradients, BackwardStep.params_final

    def spy_sanitize(params, generator):
        params = list(params)
        sanitize(params, generator)
        events.append(("sanitized", [id(p) for p in params if p.grad is not None]))

    def spy_final(self, params):
        grads = [distributed.local(p.grad) for p in params if p.grad is not None]
        sane = all(bool(g.isfinite().all()) and float(g.abs().max()) < 50 * fake_grads.SANITIZED_GRAD_STD
                   for g in grads if g.numel())
        events.append(("final", [id(p) for p in params if p.grad is not None], sane))
        return params_final(self, params)

    monkeypatch.setattr(fake_grads, "sanitize_gradients", spy_sanitize)
    monkeypatch.setattr(BackwardStep, "params_final", spy_final)
    return events


def test_the_step_begun_from_backward_runs_on_gradients_sanitized_before_dmuons_hook(tmp_path, capsys, monkeypatch):
    events = _spy_on_the_hooks(monkeypatch)
    out = tmp_path / "on.json"
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon", "--backward-step", "on", "--bucket-mb", "0.01",
                 "--warmup", "1", "--steps", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    blocks, _ = _tiny_units()
    finals = [k for k, e in enumerate(events) if e[0] == "final"]
    # Every group, in every backward but the first (warm-up 1, timed 2, counting 1: the
    # runtime is made at the first step(), so the first backward hands nothing over), was
    # handed over on gradients the overwrite had written: the last sanitized event of its
    # parameters comes before it, with no hand-over of them in between. A group is handed
    # over one group later (dmuon.backward_step): from the hook of the group reduced next,
    # right after that group's overwrite; the last group of a backward (the root) is not
    # handed over (step()'s pipeline steps it).
    assert len(finals) == 3 * len(blocks)
    for k in finals:
        ids = events[k][1]
        j = max(i for i in range(k) if events[i] == ("sanitized", ids))
        assert events[k][2] and not any(e[0] == "final" and e[1] == ids for e in events[j + 1:k]), events[j:k + 1]
        before = events[k - 1]
        assert before[0] == "sanitized" and before[1] != ids, events[k - 2:k + 1]
    dmuon = json.loads(out.read_text())["optimizers"]["dmuon"]
    m = dmuon["muon"]
    # NOTE: the step begun from backward makes its stages of the FSDP2 groups backward
    # hands over (plan/stage_windows.h): one per block.
    assert dmuon["backward_step"] and m["num_stages"] == len(blocks)
    # Stages really left inside backward, and this owner's NS ran there (rank 0 may own
    # nothing in the last stage, whose forward leaves as backward ends).
    assert 0 < m["early_stages"] <= m["num_stages"]
    assert 0 < m["early_orthogonalized"] <= m["num_orthogonalized"] and m["early_ns_s"] > 0
    assert m["early_share"] == pytest.approx(m["early_orthogonalized"] / m["num_orthogonalized"])
    assert m["early_exchange_s"] > 0 and m["early_last_forward_s"] > 0 and m["early_last_return_s"] > 0
    assert dmuon["opt_left_after_backward_ms"] > 0
    assert "of the owners' Newton–Schulz matrices ran inside backward" in printed
    assert "run, not modelled" in printed


def test_with_the_backward_step_off_nothing_leaves_early_and_the_whole_step_is_left(tmp_path, monkeypatch):
    events = _spy_on_the_hooks(monkeypatch)
    out = tmp_path / "off.json"
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon", "--backward-step", "off", "--bucket-mb", "0.01",
                 "--json", str(out)]) == 0
    dmuon = json.loads(out.read_text())["optimizers"]["dmuon"]
    m = dmuon["muon"]
    assert not dmuon["backward_step"] and not any(e[0] == "final" for e in events)
    assert m["early_stages"] == 0 and m["early_orthogonalized"] == 0 and m["early_exchange_s"] == 0
    assert dmuon["opt_left_after_backward_ms"] == pytest.approx(dmuon["opt_projected_ms"])


def test_dmuon_backward_begins_its_step_from_backward_beside_dmuon_without_it_in_one_run(tmp_path):
    # NOTE: on against off within one run, in turns (the fake rank's forward + backward moves
    # more between runs than between them).
    out = tmp_path / "both.json"
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon,dmuon-backward", "--backward-step", "off",
                 "--bucket-mb", "0.01", "--json", str(out)]) == 0
    optimizers = json.loads(out.read_text())["optimizers"]
    off, on = optimizers["dmuon"], optimizers["dmuon-backward"]
    assert not off["backward_step"] and off["muon"]["early_stages"] == 0
    assert on["backward_step"] and 0 < on["muon"]["early_stages"] <= on["muon"]["num_stages"]


def test_what_is_left_at_step_adds_the_last_early_stages_exchanges_to_the_late_pipeline():
    from dmuon.cli.bench.fake_step_projection import opt_left_after_backward, opt_projected

    m = {"fill_s": 0.003, "compute_s": 0.010, "simulated_s": 0.016, "early_stages": 0}
    # Nothing left early: the whole step (2 ms outside the pipeline + its 16 ms simulated).
    assert opt_left_after_backward(0.015, m) == pytest.approx(opt_projected(0.015, m)) == pytest.approx(0.018)
    # 3 of 4 stages left early: 1 ms of the fills ran inside backward; at step() 6 ms measured
    # = 2 ms fills + 3 ms of the last stage's compute + 1 ms outside; its pipeline 5 ms
    # simulated; the third stage's forward (issued at the end of backward) 0.5 ms and its
    # return 0.7 ms (the first two stages' returns left inside backward).
    m.update(early_stages=3, early_fill_s=0.001, late_compute_s=0.003, late_simulated_s=0.005,
             early_last_forward_s=0.0005, early_last_return_s=0.0007)
    assert opt_left_after_backward(0.006, m) == pytest.approx(0.001 + 0.005 + 0.0005 + 0.0007)


def test_profile_summarizes_one_more_step_of_each_optimizer_per_phase(capsys):
    # CPU: no device timeline; the library's host ranges and the top host ops. The step
    # begun from backward hands each FSDP2 group over from the next group's hook: the blocks
    # inside backward; the root (reduced last) is left to step()'s pipeline, and take()
    # runs inside step()'s engine call, between its input checks and its AdamW part.
    assert main([*_TINY, "--fake-world", "4", "--optimizers", "dmuon,adamw", "--backward-step", "on",
                 "--profile"]) == 0
    printed = capsys.readouterr().out
    blocks, _ = _tiny_units()
    dmuon = printed.split("profile of one dmuon step")[1].split("profile of one adamw step")[0]
    adamw = printed.split("profile of one adamw step")[1]
    fwd_bwd = dmuon.split(" bench.fwd_bwd: ")[1].split("\n")[0]
    opt = dmuon.split(" bench.opt_step: ")[1].split("\n")[0]
    # Each phase's DMuon ranges: name → calls. NOTE: the engine's calls of the begun step
    # ("backward_step.engine") run on the runtime's worker thread, counted in the phase
    # during which they ran: backward's, or step()'s where the worker was still busy.
    def calls(line):
        return {name: int(n) for name, n in re.findall(r"([\w.]+) [\d.]+ ms in (\d+) calls", line)}
    assert calls(fwd_bwd).get("backward_step.params_final") == len(blocks), fwd_bwd
    assert not any(name.startswith("step.") for name in calls(fwd_bwd)), fwd_bwd
    assert "backward_step.params_final" not in calls(opt), opt
    for name in ("backward_step.take", "step.inputs", "step.engine", "step.adamw"):
        assert calls(opt).get(name) == 1, (name, opt)
    assert "host waits: none" in fwd_bwd  # NOTE: the CPU has no device to wait for
    assert "DMuon's ranges: none" in adamw.split(" bench.fwd_bwd: ")[1].split("\n")[0]
    # The top operators are listed under each phase (self host time, calls).
    assert "x  aten::" in dmuon and "x  aten::" in adamw


def test_profile_summary_of_synthetic_phases():
    from dmuon.cli.bench.e2e_profile import PhaseProfile, format_phases

    p = PhaseProfile("bench.fwd_bwd", 12.5, range_ms={"dmuon.backward_step.params_final": 1.25},
                     range_calls={"dmuon.backward_step.params_final": 3}, syncs={"cudaStreamSynchronize": 2},
                     timeline="  device timeline of the step: …", top=[("gemm", 4.0, 10)],
                     runtime={"cudaLaunchKernel": [0.75, 30], "cudaEventRecord": [0.25, 12]})
    text = format_phases("dmuon", [p], on_gpu=True)
    # The CUDA calls inside the library's ranges, most host time first.
    assert "CUDA calls inside DMuon's ranges: cudaLaunchKernel x30 0.75 ms, cudaEventRecord x12 0.25 ms" in text
    assert "bench.fwd_bwd: host range 12.50 ms; DMuon's ranges: backward_step.params_final 1.25 ms in 3 calls; " \
           "host waits: cudaStreamSynchronize x2" in text
    assert "device timeline" in text and "    4.000 ms      10x  gemm" in text
