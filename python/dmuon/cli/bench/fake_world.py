"""One rank of a world of any size in this process: torch's fake process-group backend, the
cluster topology the step is projected onto, and the checks both `bench step --fake-world`
and `bench e2e --fake-world` share.

Under the fake backend (``torch.testing._internal.distributed.fake_pg``) collectives
complete at once and move nothing; FSDP2, DTensor and DMuon run rank r's real work. DMuon's
runtime detects the backend when it is made and plays the other ranks by the model "every
rank behaves like this one" (csrc/layout/world_model.h). What the collectives would have cost
comes from the projection (csrc/sim, ``dmuon.analysis.sim``), on the topology given here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

# NOTE: the defaults describe 8-GPU H100/H200 nodes. Intra-node: the NVLink bandwidth NCCL
# reaches in non-all-reduce collectives, ~370 GB/s of the 450 GB/s line rate per direction
# (NCCL's maintainer in NVIDIA/nccl-tests#212). Between nodes: one 400 Gb/s NIC per GPU
# (ConnectX-7 NDR), ~48.5 GB/s achieved (NVIDIA/nccl-tests#267; an all_to_all cannot
# aggregate several NICs). Latencies: order-of-magnitude figures for one NCCL collective on
# NVLink and over InfiniBand; they matter only for small buckets.
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTRA_GBPS = 370 * 8  # Gb/s
DEFAULT_INTER_GBPS = 48.5 * 8  # Gb/s
DEFAULT_INTRA_LATENCY_US = 10.0
DEFAULT_INTER_LATENCY_US = 25.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterTopology:
    """Nodes of `gpus_per_node` GPUs; the bandwidths in Gb/s (10⁹ bits per second)."""

    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    intra_gbps: float = DEFAULT_INTRA_GBPS
    inter_gbps: float = DEFAULT_INTER_GBPS
    intra_latency_us: float = DEFAULT_INTRA_LATENCY_US
    inter_latency_us: float = DEFAULT_INTER_LATENCY_US

    def validate(self) -> None:
        if not (isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1):
            raise ValueError(f"--gpus-per-node must be a positive integer, got {self.gpus_per_node!r}")
        for flag, value in (("--intra-gbps", self.intra_gbps), ("--inter-gbps", self.inter_gbps)):
            if not value > 0:
                raise ValueError(f"{flag} must be > 0 (Gb/s), got {value!r}")
        for flag, value in (("--intra-latency-us", self.intra_latency_us),
                            ("--inter-latency-us", self.inter_latency_us)):
            if not value >= 0:
                raise ValueError(f"{flag} must be >= 0 (µs), got {value!r}")

    def group(self, world_size: int, first_global_rank: int = 0, stride: int = 1):
        """The C++ topology of a group whose rank i is global rank first + i·stride."""
        from dmuon.analysis import sim

        return sim.Topology.two_level(
            world_size, self.gpus_per_node, intra_bytes_per_s=self.intra_gbps * 1e9 / 8,
            inter_bytes_per_s=self.inter_gbps * 1e9 / 8, intra_latency_s=self.intra_latency_us * 1e-6,
            inter_latency_s=self.inter_latency_us * 1e-6, first_global_rank=first_global_rank, stride=stride)

    def of_ranks(self, global_ranks: list[int]):
        """The C++ topology of a group given by its global ranks (e.g. from an FSDP2 collective)."""
        from dmuon.analysis import sim

        return sim.Topology([g // self.gpus_per_node for g in global_ranks],
                               intra_bytes_per_s=self.intra_gbps * 1e9 / 8, inter_bytes_per_s=self.inter_gbps * 1e9 / 8,
                               intra_latency_s=self.intra_latency_us * 1e-6,
                               inter_latency_s=self.inter_latency_us * 1e-6)

    def describe(self) -> dict:
        return {"gpus_per_node": self.gpus_per_node, "intra_gbps": self.intra_gbps,
                "intra_GBps": self.intra_gbps / 8, "inter_gbps": self.inter_gbps, "inter_GBps": self.inter_gbps / 8,
                "intra_latency_us": self.intra_latency_us, "inter_latency_us": self.inter_latency_us}


PROJECTION_MODEL = (
    "A collective costs latency + bytes / bandwidth: an all_to_all the latency plus its slowest rank's transfer, "
    "each rank moving max(sent, received) over its intra-node link (peers on its node) and, at the same time, "
    "over its own NIC (other nodes); FSDP2's all-gathers, reduce-scatters and all-reduces the ring formula "
    "(S-1)/S x bytes (all-reduce twice that) over the slowest link the group spans. Collectives of a rank run "
    "one at a time in issue order and complete when the last rank has reached them. The optimizer step is the "
    "step engine's stage pipeline (each stage every owner's next NS batch, its forward and return all_to_all with "
    "the bytes every rank sends each peer, forwards issued pipeline_depth stages ahead and returns applied as many "
    "behind) run on every rank with each rank's measured compute phases per stage (ranks not run predicted from "
    "the measured ones: fixed + rate x work per phase, NS work from the planner's cost model) and each wait for a "
    "collective replaced by its modelled time; the rank's step is that pipeline plus its measured time outside it "
    "(checks, host work). Compute and transfers are assumed not to slow each other.")


def add_fake_world_arguments(parser, *, rank_choice: bool) -> None:
    """--fake-world and the topology options (shared by bench step and bench e2e); with
    rank_choice (bench step) also --ranks and --memory-budget-gb."""
    parser.add_argument("--fake-world", type=int, default=None, metavar="D",
                        help="run one rank of a world of D on this device over torch's fake process group and "
                             "project the step onto the topology below (no other processes)")
    if rank_choice:
        ranks = parser.add_mutually_exclusive_group()
        ranks.add_argument("--rank", type=int, default=None, help="with --fake-world: run this rank only")
        ranks.add_argument("--ranks", choices=("slowest", "all"), default=None,
                           help="with --fake-world: 'slowest' (default) = rank 0 and the rank the planner predicts "
                                "slowest; 'all' = every rank in turn (the projection then uses no prediction)")
    else:
        parser.add_argument("--rank", type=int, default=None, help="with --fake-world: the rank to run (default 0)")
    if rank_choice:
        parser.add_argument("--fake-mesh", default=None, metavar="DPxTP",
                            help="a fake world of DP x TP ranks on a 2-D mesh (FSDP2 Shard(0) on DP; TP as torchtitan "
                                 "places it: colwise q/k/v/gate/up Shard(0), rowwise o/down Shard(1), FSDP2's strided "
                                 "shard over the colwise TP shard); --fake-world may be left out (it is DP x TP)")
    parser.add_argument("--hsdp", type=int, default=1, metavar="R",
                        help="with --fake-world: HSDP, R replicas of D/R-way sharding (a 2-D mesh replicate x shard; "
                             "1: plain FSDP)")
    parser.add_argument("--gpus-per-node", type=int, default=DEFAULT_GPUS_PER_NODE)
    parser.add_argument("--intra-gbps", type=float, default=DEFAULT_INTRA_GBPS,
                        help="intra-node bandwidth per GPU and direction, Gb/s (default: NVLink as NCCL achieves it)")
    parser.add_argument("--inter-gbps", type=float, default=DEFAULT_INTER_GBPS,
                        help="inter-node bandwidth per GPU and direction, Gb/s (default: a 400 Gb/s NIC as achieved)")
    parser.add_argument("--intra-latency-us", type=float, default=DEFAULT_INTRA_LATENCY_US)
    parser.add_argument("--inter-latency-us", type=float, default=DEFAULT_INTER_LATENCY_US)
    if rank_choice:
        parser.add_argument("--memory-budget-gb", type=float, default=None,
                            help="with --fake-world: device memory the rank may use (default: what is free now)")


def topology_from_args(args) -> ClusterTopology:
    topology = ClusterTopology(gpus_per_node=args.gpus_per_node, intra_gbps=args.intra_gbps,
                               inter_gbps=args.inter_gbps, intra_latency_us=args.intra_latency_us,
                               inter_latency_us=args.inter_latency_us)
    topology.validate()
    return topology


def check_world(world: int, hsdp: int) -> tuple[int, int]:
    """(replicas, shards) of a fake world of `world` ranks with `hsdp` replicas."""
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"--fake-world must be >= 1, got {world!r}")
    if not isinstance(hsdp, int) or hsdp < 1 or world % hsdp:
        raise ValueError(f"--hsdp must be a positive divisor of --fake-world {world}, got {hsdp!r}")
    return hsdp, world // hsdp


def parse_fake_mesh(text: str, world: int | None) -> tuple[int, int]:
    """(DP, TP) of --fake-mesh "DPxTP"; with --fake-world given it must be DP x TP."""
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--fake-mesh must be DPxTP with two positive integers (e.g. 8x8), got {text!r}")
    dp, tp = (int(p) for p in parts)
    if dp < 1 or tp < 2:
        raise ValueError(f"--fake-mesh {text}: DP must be >= 1 and TP >= 2 (TP 1 is plain FSDP2: use --fake-world "
                         f"{dp} instead), got DP {dp}, TP {tp}")
    if world is not None and world != dp * tp:
        raise ValueError(f"--fake-world {world} disagrees with --fake-mesh {text} (a world of {dp * tp}); give one "
                         "of them")
    return dp, tp


def check_fake_run(args, world: int) -> tuple[int, int, ClusterTopology, str]:
    """The checks of every --fake-world run: (replicas, shards) of --hsdp, --rank inside the
    world, the topology, no process group yet; then (replicas, shards, topology, device)."""
    from dmuon.cli.launch import resolve_device

    replicas, shards = check_world(world, args.hsdp)
    if args.rank is not None:
        check_rank(args.rank, world)
    topology = topology_from_args(args)
    require_no_process_group()
    return replicas, shards, topology, resolve_device(args.device)


def world_mesh(device: str, world: int, replicas: int):
    """The fake world's mesh: 1-D over every rank, or HSDP's 2-D (replicate, shard) one."""
    from torch.distributed.device_mesh import init_device_mesh

    if replicas > 1:
        return init_device_mesh(device, (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device, (world,))


def check_rank(rank: int, world: int) -> None:
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"--rank {rank} is outside the fake world of {world} (ranks 0..{world - 1})")


def require_no_process_group() -> None:
    """--fake-world plays every rank itself: a real process group already initialized in this
    process would be shadowed (and its collectives mixed with fake ones)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend()
        raise RuntimeError(f"--fake-world needs a process without an initialized process group, but one is "
                           f"initialized (backend {backend!r}, rank {dist.get_rank()} of {dist.get_world_size()}); "
                           "run the fake-world benchmark in its own process")


@contextlib.contextmanager
def fake_rank(rank: int, world: int) -> Iterator[None]:
    """This process as `rank` of a fake world of `world` ranks for the block's duration."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    require_no_process_group()
    check_rank(rank, world)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def available_bytes(device: str) -> int:
    """Device memory free now: the CUDA driver's figure, or the host's MemAvailable."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 0


def check_fits(what: str, needed: int, device: str, budget_gb: float | None) -> None:
    """A named error when `needed` bytes exceed the memory budget (given, or free now)."""
    budget = int(budget_gb * 1e9) if budget_gb is not None else available_bytes(device)
    source = f"--memory-budget-gb {budget_gb:g}" if budget_gb is not None else f"free on {device} now"
    if budget > 0 and needed > budget:
        raise ValueError(f"{what} does not fit the device: it needs {needed / 1e9:.2f} GB ({needed} bytes), "
                         f"{budget / 1e9:.2f} GB ({budget} bytes) are available ({source}); use a larger "
                         "--fake-world (smaller shards) or a device with more memory")
