"""DMuon's AdamW part: the device copies of its step counters (dmuon.adamw_steps, what
torch's fused AdamW reads on CUDA), on the CPU the part against torch's default AdamW
(bitwise), and, on a GPU (marker gpu), the part against torch's
own fused AdamW over the same parameters: the same kernel on the same inputs, so equal
bitwise, across a checkpoint reload that rewinds the counters."""

from __future__ import annotations

import copy

import pytest
import torch

import dmuon
from dmuon.adamw_steps import DeviceSteps


def test_device_steps_follow_the_cpu_counters_and_are_remade_when_they_move():
    table = DeviceSteps()
    steps = [torch.tensor(0.0), torch.tensor(4.0)]
    first = table.of(0, steps, torch.device("cpu"))
    assert [float(s) for s in first] == [0.0, 4.0]
    assert all(d is not s for d, s in zip(first, steps)), "copies, not the CPU counters"
    # The fused step advances the device copies; advanced() does the CPU counters.
    torch._foreach_add_(first, 1.0)
    table.advanced(0, steps)
    assert [float(s) for s in steps] == [1.0, 5.0]
    again = table.of(0, steps, torch.device("cpu"))
    assert all(a is b for a, b in zip(again, first)), "kept while the CPU counters hold the expected values"
    # A counter set by hand (or a loaded checkpoint's new tensor) is copied again.
    steps[0].fill_(9.0)
    loaded = torch.tensor(2.0)
    remade = table.of(0, [steps[0], loaded], torch.device("cpu"))
    assert [float(s) for s in remade] == [9.0, 2.0]
    assert remade[0] is not first[0]
    # The group's table keeps only the counters it was last given.
    assert len(table._groups[0]) == 2 and id(steps[1]) not in table._groups[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_adamw_part_on_the_cpu_is_torchs_default_adamw_bitwise(dtype):
    """On the CPU the part runs torch's foreach passes: the same values as
    torch.optim.AdamW's default there (one tensor at a time), float16 through float32
    moments (DMuon's rule: equal to torch's on float32 copies rounded back)."""
    torch.manual_seed(0)
    mat = torch.nn.Parameter(torch.randn(24, 16))
    vecs = [torch.nn.Parameter(torch.randn(n).to(dtype)) for n in (32, 7, 300)]
    theirs = [torch.nn.Parameter(v.detach().float().clone()) for v in vecs]
    opt = dmuon.DMuon([dict(params=[mat]), dict(params=vecs, use_muon=False)], lr=0.02, adamw_lr=3e-3,
                      weight_decay=0.1, adamw_betas=(0.8, 0.95), adamw_eps=1e-7)
    ref = torch.optim.AdamW(theirs, lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1)
    for step in range(5):
        mat.grad = torch.randn_like(mat)
        for v, t in zip(vecs, theirs):
            g = torch.randn(v.shape).to(dtype)
            v.grad, t.grad = g.clone(), g.float()
        opt.step()
        ref.step()
        with torch.no_grad():
            for k, (v, t) in enumerate(zip(vecs, theirs)):
                assert torch.equal(v.detach(), t.detach().to(dtype)), f"step {step + 1}, vector {k}"
                t.copy_(v.float())  # NOTE: float16 rounds the parameter back each step, as DMuon does


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_adamw_part_on_cuda_is_torchs_fused_adamw(dtype):
    torch.manual_seed(0)
    mat = torch.nn.Parameter(torch.randn(64, 96, device="cuda", dtype=dtype))
    vecs = [torch.nn.Parameter(torch.randn(n, device="cuda", dtype=dtype)) for n in (32, 7, 300)]
    theirs = [torch.nn.Parameter(v.detach().clone()) for v in vecs]
    opt = dmuon.DMuon([dict(params=[mat]), dict(params=vecs, use_muon=False)], lr=0.02, adamw_lr=3e-3,
                      weight_decay=0.1, adamw_betas=(0.8, 0.95), adamw_eps=1e-7)
    ref = torch.optim.AdamW(theirs, lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1, fused=True)
    saved = None
    for step in range(6):
        grads = [torch.randn_like(v) for v in vecs]
        mat.grad = torch.randn_like(mat)
        for v, t, g in zip(vecs, theirs, grads):
            v.grad, t.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for k, (v, t) in enumerate(zip(vecs, theirs)):
            assert torch.equal(v.detach(), t.detach()), f"step {step + 1}, vector {k}"
        if step == 1:
            # NOTE: deep copies: a state_dict holds the live state tensors.
            saved = (copy.deepcopy(opt.state_dict()), copy.deepcopy(ref.state_dict()),
                     [v.detach().clone() for v in vecs])
        if step == 3:
            # Rewind both to step 2: the device counters must follow the loaded CPU ones.
            opt.load_state_dict(saved[0])
            ref.load_state_dict(saved[1])
            with torch.no_grad():
                for v, t, w in zip(vecs, theirs, saved[2]):
                    v.copy_(w)
                    t.copy_(w)
    assert float(opt.state[vecs[0]]["step"]) == 4.0
    assert opt.state[vecs[0]]["step"].device.type == "cpu", "checkpoints keep the CPU counter"
