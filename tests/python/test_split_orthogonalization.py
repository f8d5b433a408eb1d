"""Split orthogonalization: groups with split_rows / split_heads (rows) and
split_heads with split_dim=1 (o_proj's column blocks) against the
plain-loop reference (dmuon.reference: split, NS each block, scale per block, join) on one
process and over Gloo (FSDP2 world 2 and 3, where Shard(0) chunks cut blocks; DDP world 2),
the options' errors, and the state (whole momentum per parameter) through state_dict and DCP."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import dmuon
from dist_harness import run_distributed
from dmuon import runtime_builder
from worker_tensors import reference_of, update_errors, whole_numpy, wholes

# fp32 parameters, NS in fp32 (DMuon, CPU) vs fp64 (reference): relative to the weight's scale.
TOLERANCE = 1e-5


# ---------------------------------------------------------------- the model and the ranks
# A tiny decoder block with a fused q, k, v (GQA), per-head q, per-head o (column blocks), a
# fused gate/up, trained on one process or under Gloo (FSDP2, DDP) against the reference.

# Rows: fused q, k, v = 12 + 6 + 6 (GQA: 4 q heads, 2 kv heads of 3 rows); gate/up = 2 × 20.
QKV_ROWS = (12, 6, 6)
HEADS = 4
INTER = 20
# o_proj is [12, 36]: 4 column blocks (heads) of 9 columns, each a 12x9 matrix.
O_HEADS = 4


class SplitBlock(nn.Module):
    """Embedding → fused qkv, per-head o, fused gate_up, down → head (no attention math:
    what matters is that every matrix gets a gradient)."""

    def __init__(self, hidden: int = 12, vocab: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv_proj = nn.Linear(hidden, sum(QKV_ROWS), bias=False)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(sum(QKV_ROWS) + hidden, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * INTER, bias=False)
        self.down_proj = nn.Linear(INTER, hidden, bias=False)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.o_proj(torch.cat([self.qkv_proj(x), self.q_proj(x)], -1).tanh())
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        x = x + self.down_proj(torch.nn.functional.silu(gate) * up)
        return self.lm_head(x)


def split_groups(model: nn.Module, **options) -> list[dict]:
    """One group per split (named parameters), the rest routed (Muon / AdamW)."""
    named = dict(model.named_parameters())
    strip = lambda n: n.removeprefix("module.")  # noqa: E731
    pick = lambda leaf: [(n, p) for n, p in named.items() if strip(n).startswith(leaf)]  # noqa: E731
    split = {"qkv_proj", "q_proj", "gate_up_proj", "o_proj"}
    rest = [(n, p) for n, p in named.items() if strip(n).split(".")[0] not in split]
    return [{"params": pick("qkv_proj"), "use_muon": True, "split_rows": list(QKV_ROWS), **options},
            {"params": pick("q_proj"), "use_muon": True, "split_heads": HEADS, **options},
            {"params": pick("gate_up_proj"), "use_muon": True, "split_rows": [INTER, INTER], **options},
            {"params": pick("o_proj"), "use_muon": True, "split_heads": O_HEADS, "split_dim": 1, **options},
            {"params": rest}]


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 32, (4, 5), generator=torch.Generator().manual_seed(step))


def loss_step(model: nn.Module, optimizer, step: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(batch(step)).pow(2).mean().backward()
    optimizer.step()


def wrap(model: nn.Module, wrapper: str, world: int) -> nn.Module:
    """FSDP2 on every parameter's module (Shard(0): uneven chunks cut the blocks), or DDP."""
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for module in model.children():
            fully_shard(module, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return nn.parallel.DistributedDataParallel(model)


def sharded_matches_the_reference(rank: int, world: int, wrapper: str) -> dict:
    """3 steps of DMuon under `wrapper` against the single-process reference (fp64 NS)."""
    torch.manual_seed(0)
    model = SplitBlock()
    exact = copy.deepcopy(model)
    model = wrap(model, wrapper, world)
    optimizer = dmuon.DMuon(split_groups(model, ns_algorithm="standard", adjust_lr="match_rms_adamw"),
                            lr=0.05, weight_decay=0.1)
    reference = reference_of(optimizer, exact)
    for step in range(3):
        loss_step(model, optimizer, step)
        # NOTE: data parallel: the mean loss of every rank's identical batch is this one's.
        exact.zero_grad(set_to_none=True)
        exact(batch(step)).pow(2).mean().backward()
        reference.step()
    ours = {n.removeprefix("module."): whole_numpy(p) for n, p in model.named_parameters()}
    theirs = {n: whole_numpy(p) for n, p in exact.named_parameters()}
    local_rows = {n.removeprefix("module."): (p.to_local() if hasattr(p, "to_local") else p).shape[0]
                  for n, p in model.named_parameters()}
    return {"ours": ours, "theirs": theirs, "local_rows": local_rows}


def checkpoint_round_trip(rank: int, world: int, path: str) -> dict:
    """FSDP2: 2 steps, a DCP save, 2 more (the uninterrupted run); a fresh model and
    optimizer load the checkpoint and take the same 2 steps."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fresh(lr: float):
        torch.manual_seed(0)
        model = wrap(SplitBlock(), "fsdp2", world)
        return model, dmuon.DMuon(split_groups(model, ns_algorithm="standard"), lr=lr, weight_decay=0.1)

    model, optimizer = fresh(0.05)
    for step in range(2):
        loss_step(model, optimizer, step)
    msd, osd = get_state_dict(model, optimizer)
    dmuon.checkpoint.save({"model": msd, "optim": osd}, path)
    shapes = {k: tuple(v.shape) for k, v in optimizer.state[model.qkv_proj.weight].items() if torch.is_tensor(v)}
    for step in range(2, 4):
        loss_step(model, optimizer, step)
    straight = {n: whole_numpy(p) for n, p in model.named_parameters()}
    dist.barrier()
    loaded, loaded_opt = fresh(0.5)
    msd, osd = get_state_dict(loaded, loaded_opt)
    state = {"model": msd, "optim": osd}
    dmuon.checkpoint.load(state, path)
    set_state_dict(loaded, loaded_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    groups = [(g.get("split_rows"), g.get("split_heads"), g["lr"]) for g in loaded_opt.param_groups]
    for step in range(2, 4):
        loss_step(loaded, loaded_opt, step)
    resumed = {n: whole_numpy(p) for n, p in loaded.named_parameters()}
    return {"straight": straight, "resumed": resumed, "groups": groups, "momentum_shapes": shapes,
            "param_shape": tuple(model.qkv_proj.weight.shape)}


def backward_step_matches_post_backward(rank: int, world: int, wrapper: str) -> dict:
    """3 steps with the step begun inside backward (column blocks included) and after it:
    per parameter ‖Δon − Δoff‖ / ‖Δoff‖, and the stages each step left during backward."""
    torch.manual_seed(0)
    base = SplitBlock()
    models, opts, initial = {}, {}, {}
    for on in (True, False):
        model = copy.deepcopy(base)
        initial[on] = wholes(model)
        models[on] = (wrap(model, "fsdp2", world) if wrapper == "fsdp2"
                      else nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=1e-4))
        opts[on] = dmuon.DMuon(split_groups(models[on], ns_algorithm="standard"), lr=0.05, weight_decay=0.1,
                               execution=dmuon.Execution(backward_step=on, bucket_size_mb=0.0005))
        opts[on].attach_backward_step(models[on])
    early = []
    for step in range(3):
        for on in (True, False):
            loss_step(models[on], opts[on], step)
        early.append(opts[True].runtime.last_stats.early_stages)
    return {"errors": update_errors(models[True], initial[True], models[False], initial[False]), "early": early}


# ---------------------------------------------------------------- tests
def _relative(ours: dict, theirs: dict) -> dict:
    return {n: float(np.abs(ours[n] - theirs[n]).max() / np.abs(theirs[n]).max()) for n in theirs}


def _train_one_process(groups_of, steps: int = 3):
    torch.manual_seed(0)
    model = SplitBlock()
    exact = copy.deepcopy(model)
    optimizer = dmuon.DMuon(groups_of(model), lr=0.05, weight_decay=0.1)
    reference = reference_of(optimizer, exact)
    for step in range(steps):
        loss_step(model, optimizer, step)
        exact.zero_grad(set_to_none=True)
        exact(batch(step)).pow(2).mean().backward()
        reference.step()
    return model, exact, optimizer


@pytest.mark.parametrize("adjust_lr", [None, "match_rms_adamw", "spectral"])
def test_one_process_matches_the_plain_loop_reference(adjust_lr):
    model, exact, optimizer = _train_one_process(
        lambda m: split_groups(m, ns_algorithm="standard", adjust_lr=adjust_lr))
    errors = _relative({n: whole_numpy(p) for n, p in model.named_parameters()},
                       {n: whole_numpy(p) for n, p in exact.named_parameters()})
    assert max(errors.values()) < TOLERANCE, errors
    assert optimizer.matrix_view(model.qkv_proj.weight).row_blocks == QKV_ROWS
    assert optimizer.matrix_view(model.q_proj.weight).row_blocks == (3, 3, 3, 3)
    assert optimizer.matrix_view(model.o_proj.weight).col_blocks == O_HEADS
    # One NS item per block: 3 + 4 + 2 + 4 for the split groups, down_proj whole.
    assert len(optimizer.runtime.item_params) == 3 + HEADS + 2 + O_HEADS + 1


def test_the_split_changes_the_update():
    """The same run without the split ends elsewhere (so the comparison above can fail)."""
    def unsplit(m):
        return [{k: v for k, v in g.items() if not k.startswith("split_")} for g in split_groups(m)]
    split, _, _ = _train_one_process(split_groups)
    whole, _, _ = _train_one_process(unsplit)
    for name in ("qkv_proj.weight", "q_proj.weight", "gate_up_proj.weight", "o_proj.weight"):
        a, b = (whole_numpy(dict(m.named_parameters())[name]) for m in (split, whole))
        assert np.abs(a - b).max() > 1e-3, name


def test_default_is_whole_matrices():
    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(model, lr=0.05)
    assert all(g["split_rows"] is None and g["split_heads"] is None for g in optimizer.param_groups if g["use_muon"])
    assert optimizer.matrix_view(model.qkv_proj.weight).row_blocks == ()


def test_changing_the_split_rebuilds_the_runtime():
    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(split_groups(model), lr=0.05)
    loss_step(model, optimizer, 0)
    items = len(optimizer.runtime.item_params)
    optimizer.param_groups[1]["split_heads"] = 2
    loss_step(model, optimizer, 1)
    assert len(optimizer.runtime.item_params) == items - 2


def _bad(groups_edit, match):
    torch.manual_seed(0)
    model = SplitBlock()
    groups = split_groups(model)
    groups_edit(groups, model)
    with pytest.raises(ValueError, match=match):
        dmuon.DMuon(groups, lr=0.05)


def test_bad_options_name_the_parameter_and_option():
    _bad(lambda g, m: g[0].update(split_rows=[12, 6, 5]),
         r"param group 0: split_rows=\[12, 6, 5\] for parameter 'qkv_proj.weight' "
         r".*sum to 23 rows, the parameter has 24")
    _bad(lambda g, m: g[1].update(split_heads=5), r"split_heads=5 for parameter 'q_proj.weight'.*not divisible into 5")
    _bad(lambda g, m: g[0].update(split_rows=[12, 0, 12]), r"param group 0: split_rows must be .*positive")
    _bad(lambda g, m: g[0].update(split_rows=12), r"param group 0: split_rows must be None or a sequence")
    _bad(lambda g, m: g[1].update(split_heads=2.0), r"param group 1: split_heads must be None or a positive integer")
    _bad(lambda g, m: g[1].update(split_rows=[6, 6]), r"split_rows and split_heads are both set")
    _bad(lambda g, m: g[1].update(split_cols=4), r"unknown option.*split_cols.*split_heads=n with split_dim=1")
    _bad(lambda g, m: g[3].update(split_dim=2), r"param group 3: split_dim must be None, 0 \(rows\) or 1")
    _bad(lambda g, m: g[3].update(split_heads=None, split_rows=[18, 18]),
         r"param group 3: split_dim=1 \(column blocks\) takes split_heads=n")
    _bad(lambda g, m: g[3].update(split_heads=None), r"param group 3: split_dim=1 \(column blocks\) needs split_heads")
    _bad(lambda g, m: g[3].update(split_heads=5),
         r"split_heads=5, split_dim=1 for parameter 'o_proj.weight'.*36 columns are not divisible into 5")


def test_splits_that_do_not_fit_the_view_are_refused():
    stack = nn.Parameter(torch.randn(2, 8, 4))
    with pytest.raises(ValueError, match=r"split_heads=2 for parameter 'experts.w' .*stack of matrices"):
        dmuon.DMuon([{"params": [("experts.w", stack)], "use_muon": True, "split_heads": 2}])
    mha = nn.MultiheadAttention(8, 2, bias=False)
    # in_proj_weight is q, k, v blocks of 8 already: 6 heads of 4 rows keep those boundaries, 4 of 6 do not.
    opt = dmuon.DMuon([{"params": [("attn.in_proj_weight", mha.in_proj_weight)], "use_muon": True,
                        "split_heads": 6}])
    assert opt.matrix_view(mha.in_proj_weight).row_blocks == (4,) * 6
    with pytest.raises(ValueError, match=r"row blocks \[8, 8, 8\] already.*row 8 is inside"):
        dmuon.DMuon([{"params": [("attn.in_proj_weight", mha.in_proj_weight)], "use_muon": True, "split_heads": 4}])


def test_a_bad_split_set_after_construction_refuses_the_step():
    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(split_groups(model), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.param_groups[2]["split_rows"] = [20, 21]
    with pytest.raises(RuntimeError, match=r"'gate_up_proj.weight'.*sum to 41 rows.*nothing was updated"):
        loss_step(model, optimizer, 0)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_a_refused_step_leaves_column_blocks_and_their_momentum():
    """A non-finite gradient refuses the step: the staged copies are not written back."""
    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(split_groups(model), lr=0.05, nonfinite="skip")
    loss_step(model, optimizer, 0)
    weight = model.o_proj.weight
    before = weight.detach().clone(), optimizer.state[weight]["momentum_buffer"].clone()
    optimizer.zero_grad(set_to_none=True)
    model(batch(1)).pow(2).mean().backward()
    model.down_proj.weight.grad[0, 0] = float("nan")
    optimizer.step()
    assert torch.equal(weight, before[0]) and torch.equal(optimizer.state[weight]["momentum_buffer"], before[1])
    assert optimizer.param_groups[3]["num_skipped_steps"] == 1


def test_column_blocks_refuse_other_views():
    mha = nn.MultiheadAttention(8, 2, bias=False)
    with pytest.raises(ValueError, match=r"split_dim=1 for parameter 'attn.in_proj_weight'.*row blocks \[8, 8, 8\]"):
        dmuon.DMuon([{"params": [("attn.in_proj_weight", mha.in_proj_weight)], "use_muon": True, "split_heads": 2,
                      "split_dim": 1}])
    conv = nn.Parameter(torch.randn(8, 4, 3, 3))
    with pytest.raises(ValueError, match=r"split_dim=1 for parameter 'conv.weight'.*2-D weight"):
        dmuon.DMuon([{"params": [("conv.weight", conv)], "use_muon": True, "split_heads": 2, "split_dim": 1}])


def test_column_blocks_of_float64_parameters_are_refused_at_step_naming_the_parameter():
    """float64 parameters go through the torch adapter's ATen ops, whose passes read
    contiguous pieces only: their column blocks (strided pieces) are refused by name, not
    read as if contiguous (float32 ones step)."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        o_proj = nn.Parameter(torch.randn(8, 12, dtype=dtype))
        optimizer = dmuon.DMuon([{"params": [("o_proj.weight", o_proj)], "use_muon": True, "split_heads": 4,
                                  "split_dim": 1}], lr=0.05)
        o_proj.grad = torch.randn_like(o_proj)
        before = o_proj.detach().clone()
        if dtype == torch.float32:
            optimizer.step()
            assert not torch.equal(o_proj.detach(), before)
            continue
        with pytest.raises(RuntimeError, match=r"parameter 'o_proj.weight': its 4 column blocks are strided "
                                               r"pieces.*float64 parameters.*split_dim=None"):
            optimizer.step()
        assert torch.equal(o_proj.detach(), before)


def test_column_blocks_on_a_mesh_of_several_dims_are_refused():
    from dmuon.distributed import Placement

    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(split_groups(model), lr=0.05)
    tp = Placement(global_shape=(12, 36), sharded=True, group=None, mesh_shape=(2, 2),
                   mesh_placements=(("shard", 0, 1), ("shard", 1, 1)), rank_coords=((0, 0), (0, 1), (1, 0), (1, 1)))
    with pytest.raises(ValueError, match=r"split_heads=4, split_dim=1 for parameter 'o_proj.weight': .*2-D mesh"):
        runtime_builder.layout(optimizer, model.o_proj.weight, tp)


def test_state_dict_round_trip_keeps_whole_momentum():
    torch.manual_seed(0)
    model = SplitBlock()
    optimizer = dmuon.DMuon(split_groups(model, ns_algorithm="standard"), lr=0.05)
    for step in range(2):
        loss_step(model, optimizer, step)
    assert optimizer.state[model.qkv_proj.weight]["momentum_buffer"].shape == model.qkv_proj.weight.shape
    assert optimizer.state[model.o_proj.weight]["momentum_buffer"].shape == model.o_proj.weight.shape
    saved = copy.deepcopy(optimizer.state_dict())
    twin = copy.deepcopy(model)
    twin_opt = dmuon.DMuon(split_groups(twin, ns_algorithm="standard", lr=0.5), lr=0.5)
    twin_opt.load_state_dict(saved)
    assert twin_opt.param_groups[0]["split_rows"] == QKV_ROWS and twin_opt.param_groups[1]["split_heads"] == HEADS
    for step in range(2, 4):
        loss_step(model, optimizer, step)
        loss_step(twin, twin_opt, step)
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("world,wrapper", [(2, "fsdp2"), (3, "fsdp2"), (2, "ddp")])
def test_distributed_matches_the_reference(world, wrapper):
    results = run_distributed(sharded_matches_the_reference, world, wrapper)
    for rank, out in results.items():
        errors = _relative(out["ours"], out["theirs"])
        assert max(errors.values()) < TOLERANCE, (rank, errors)
    if wrapper == "fsdp2" and world == 3:
        # torch.chunk of 24 qkv rows over 3 ranks: 8 each, so rank 0's chunk ends inside the
        # q block (12 rows) and rank 1's holds the end of q and all of k; 40 gate/up rows:
        # 14, 14, 12 (the gate/up boundary at row 20 falls inside rank 1's chunk).
        assert [results[r]["local_rows"]["qkv_proj.weight"] for r in range(3)] == [8, 8, 8]
        assert [results[r]["local_rows"]["gate_up_proj.weight"] for r in range(3)] == [14, 14, 12]


def test_dcp_checkpoint_of_a_split_group_resumes_exactly(tmp_path):
    results = run_distributed(checkpoint_round_trip, 2, str(tmp_path / "ckpt"))
    for rank, out in results.items():
        # One momentum tensor per parameter, placed like it (no per-block state).
        assert out["momentum_shapes"]["momentum_buffer"] == out["param_shape"]
        assert out["groups"][0][:2] in ((list(QKV_ROWS), None), (QKV_ROWS, None)), out["groups"]
        assert out["groups"][1][1] == HEADS and out["groups"][0][2] == 0.05
        for name, value in out["straight"].items():
            assert np.array_equal(value, out["resumed"][name]), (rank, name)


@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_column_blocks_step_inside_backward_as_after_it(wrapper):
    # NOTE: the same plan and per-block math on the CPU ops; only the stages' composition
    # differs (backward order): test_backward_step's bound.
    results = run_distributed(backward_step_matches_post_backward, 2, wrapper)
    for rank, out in results.items():
        assert max(out["errors"].values()) < 1e-6, (rank, out["errors"])
        assert all(stages > 0 for stages in out["early"][1:]), (rank, out["early"])
