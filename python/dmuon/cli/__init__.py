"""dmuon's tools, apart from the library: `python -m dmuon train | plan | bench`.

  main.py    the command line: each command's module registers its subparser
  usage.py   bad input reported as argparse reports its own errors
  launch.py  local multi-process launcher (Gloo on CPUs, NCCL one GPU per rank)
  train/     a small GPT trained with dmuon and AdamW
  plan/      the owner planner over model manifests (the shipped manifests/ live here)
  bench/     benchmarks: ns (one GPU), step (distributed step), e2e (training step)

The tools use only the library's public API (dmuon's exports, dmuon.analysis: the C++
planner and cost models, the runtime's statistics through DMuon.runtime, the torch.ops.dmuon_testing
ops);
tests/python/test_cli_structure.py checks that and that no import cycle forms here.
"""
