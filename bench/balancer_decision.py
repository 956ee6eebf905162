"""Measure the balancer's decision time per strategy for pools of 8, 64 and 1,000 targets.

Usage: ``python bench/balancer_decision.py [--repeat 200]``. Pure Python, no Django: each pool is a
fixed random snapshot (two tiers, a few disabled, draining, unhealthy, degraded and full targets,
engine metrics and latency samples on most, one sticky conversation), and each number is the best of
many short runs, in microseconds per decision. Goals: < 20 µs for 8 targets,
< 1 ms for 1,000.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pools.balancer.snapshot import (  # noqa: E402
    DrainState,
    Health,
    PoolPolicy,
    RequestFacts,
    TargetView,
)
from pools.balancer.strategies import decide  # noqa: E402

SIZES = (8, 64, 1000)
STRATEGIES = ("smart", "priority", "capacity", "least_busy", "round_robin")
GOALS_US = {8: 20.0, 64: None, 1000: 1000.0}
KINDS = frozenset({"chat", "completions"})


def make_targets(count: int, seed: int = 7) -> list[TargetView]:
    """Return a realistic pool snapshot of `count` targets."""
    rng = random.Random(seed)
    targets = []
    for index in range(count):
        capacity = rng.choice((2, 4, 4, 8, 8, 16))
        roll = rng.random()
        targets.append(
            TargetView(
                id=index + 1,
                name=f"engine-{index + 1}",
                priority=1 if index < count * 7 // 8 else 2,
                capacity=capacity,
                position=index,
                kinds=KINDS,
                model_id="demo-8b",
                enabled=roll > 0.02,
                drain=DrainState.DRAINING if 0.02 < roll < 0.04 else DrainState.ACTIVE,
                health=(
                    Health.UNHEALTHY
                    if 0.04 < roll < 0.05
                    else Health.DEGRADED
                    if 0.05 < roll < 0.08
                    else Health.HEALTHY
                ),
                in_flight=capacity if 0.08 < roll < 0.15 else rng.randrange(capacity),
                engine_running=rng.randrange(capacity + 1) if roll < 0.8 else None,
                engine_waiting=rng.randrange(3) if roll < 0.8 else None,
                ttft_s=rng.uniform(0.03, 0.3) if roll < 0.9 else None,
                tpot_s=rng.uniform(0.005, 0.04) if roll < 0.9 else None,
                error_rate=rng.choice((0.0, 0.0, 0.0, 0.05)),
                warm=roll < 0.7,
            )
        )
    return targets


def measure(count: int, strategy: str, repeat: int) -> float:
    """Return the best observed microseconds per decision."""
    targets = make_targets(count)
    policy = PoolPolicy(strategy=strategy)
    request = RequestFacts(kind="chat", sticky_target_id=3, prefix_target_id=5)
    rng = random.Random(1)
    turns = iter(range(10**9))

    def once() -> None:
        decide(targets, policy, request, rng=rng, turn=next(turns))

    # Many short samples, keeping the best: on a shared machine some samples run undisturbed,
    # and the best one is the cost of the code, not of its neighbours.
    number = max(2, 2_000 // count)
    timer = timeit.Timer(once, timer=time.perf_counter)
    return min(timer.repeat(number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{'strategy':<12}" + "".join(f"{size:>10} targets" for size in SIZES))
    for strategy in STRATEGIES:
        row = [measure(size, strategy, args.repeat) for size in SIZES]
        print(f"{strategy:<12}" + "".join(f"{value:>15.1f} µs" for value in row))
    goals = ", ".join(f"< {goal:g} µs for {size}" for size, goal in GOALS_US.items() if goal)
    print(f"goals: {goals}")


if __name__ == "__main__":
    main()
