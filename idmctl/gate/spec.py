"""Check ``spec``: the spec validated (it did, or preflight would have stopped with exit 2) and it
asks for what one node of this cluster has: a known QoS, GPUs, CPUs and memory within a node."""

from __future__ import annotations

from idmctl.core.checks import CheckResult, PreflightContext, Status
from ground.spec.schema import ODD_ABOVE
from ground.units import format_bytes

NAME = "spec"


def check(ctx: PreflightContext) -> CheckResult:
    spec, profile = ctx.spec, ctx.profile
    res, node = spec.resources, profile.node
    problems: list[str] = []
    fixes: list[str] = []
    if res.qos not in profile.qos:
        problems.append(f"resources.qos {res.qos!r} is not a QoS of cluster {profile.name} ({', '.join(profile.qos)})")
        fixes.append("pick one of the cluster's QoS tiers")
    if res.gpus_per_node > node.gpus:
        problems.append(f"resources.gpus_per_node {res.gpus_per_node} > {node.gpus} GPUs on a {profile.name} node")
        fixes.append(f"ask for at most {node.gpus} GPUs per node, or use --cluster for the cluster it runs on")
    if res.cpus > node.cpus:
        problems.append(f"resources.cpus {res.cpus} > {node.cpus} CPUs on a {profile.name} node")
        fixes.append(f"ask for at most {node.cpus} CPUs")
    if res.mem_bytes > node.mem_bytes:
        problems.append(f"resources.mem {res.mem} > {node.mem} on a {profile.name} node")
        fixes.append(f"ask for at most {node.mem}")
    data = spec.data
    shape = (f"N={data.routing_n} (cache indices {','.join(map(str, data.selected_layer_indices))} → blocks "
             f"{','.join(map(str, data.selected_blocks))}), world {res.world_size} = {res.nodes} node{'s' if res.nodes > 1 else ''} × "
             f"{res.ranks_per_node} rank{'s' if res.ranks_per_node > 1 else ''}, grad accum {spec.grad_accum} = {spec.train.effective_batch:,} ÷ "
             f"({spec.loader.batch_size} × {res.world_size})")
    numbers = {"spec_hash": ctx.resolved.hash, "routing_n": data.routing_n, "world_size": res.world_size,
               "grad_accum": spec.grad_accum, "mem_bytes": res.mem_bytes, "node_mem_bytes": node.mem_bytes}
    if problems:
        return CheckResult(NAME, Status.FAIL, "; ".join(problems), numbers, "; ".join(fixes))
    odd = [f"train.{field} {getattr(spec.train, field):g} is above {limit:g}"
           for field, limit in ODD_ABOVE.items() if getattr(spec.train, field) > limit]
    if odd:  # inside the domain, but no real run uses it: most likely a typo (3.0e3 for 3.0e-3)
        return CheckResult(NAME, Status.WARN, "; ".join(odd) + f" (unusual for AdamW); {shape}", numbers,
                           "check the value: AdamW runs use lr 1e-6 … 1e-2 and weight_decay 0 … 0.1")
    summary = (f"valid, hash {ctx.resolved.short_hash}; {shape}; fits a {profile.name} node "
               f"({res.gpus_per_node}/{node.gpus} GPUs, {res.cpus}/{node.cpus} CPUs, "
               f"{format_bytes(res.mem_bytes)}/{format_bytes(node.mem_bytes)} memory)")
    return CheckResult(NAME, Status.PASS, summary, numbers)
