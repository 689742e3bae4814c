"""Default kernels on models that were not tuned on, against long full-data NUTS.

Twenty-six models as users write them (``_unseen_models.suite``): GLMs with scale, shape and
cut-point parameters, censored survival, zero inflation, mixtures (one with a discrete
assignment summed out by enumeration), collinear and wide regressions, a small data set, and
hierarchical models written centred, with ``LocScaleReparam`` and non-centred by hand.
``SGLD(model)`` and ``SGHMC(model)`` (on request also ``SGNHT`` and ``EnergyConservingHMC``)
at default arguments under the package's ``MCMC`` (4 vectorized chains), as in
``bench_hierarchical.py``, whose runs, columns and NUTS references (1000 + 10,000 draws,
cached) this benchmark shares.

    python benchmarks/bench_models.py                    # 4 chains x (1000 + 10,000)
    python benchmarks/bench_models.py --problems probit,eight-groups --methods sgld
    python benchmarks/bench_models.py --methods sgnht,ecs --out benchmarks/results/x.json
    python benchmarks/bench_models.py --batch 2          # the second batch (_unseen_models2)
    python benchmarks/bench_models.py --batch 3          # the third batch (_unseen_models3)
    python benchmarks/bench_models.py --batch 4          # the fourth batch (_unseen_models4)
    python benchmarks/bench_models.py --batch 5          # the fifth batch (_unseen_models5)
    python benchmarks/bench_models.py --batch 6          # the sixth batch (_unseen_models6)
    python benchmarks/bench_models.py --batch 7          # the seventh batch (_unseen_models7)
    python benchmarks/bench_models.py --batch 8          # the eighth batch (_unseen_models8)
    python benchmarks/bench_models.py --batch 9          # the ninth batch (_unseen_models9)
    python benchmarks/bench_models.py --batch 10         # the tenth batch (_unseen_models10)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _unseen_models  # noqa: E402
import _unseen_models2  # noqa: E402
import _unseen_models3  # noqa: E402
import _unseen_models4  # noqa: E402
import _unseen_models5  # noqa: E402
import _unseen_models6  # noqa: E402
import _unseen_models7  # noqa: E402
import _unseen_models8  # noqa: E402
import _unseen_models9  # noqa: E402
import _unseen_models10  # noqa: E402
import bench_hierarchical  # noqa: E402

BATCHES = {1: _unseen_models.suite, 2: _unseen_models2.suite, 3: _unseen_models3.suite,
           4: _unseen_models4.suite, 5: _unseen_models5.suite, 6: _unseen_models6.suite,
           7: _unseen_models7.suite, 8: _unseen_models8.suite,
           9: _unseen_models9.suite, 10: _unseen_models10.suite}


def main(argv=None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--batch", type=int, choices=sorted(BATCHES), default=1)
    known, rest = pre.parse_known_args(argv)
    script = "bench_models.py" + ("" if known.batch == 1 else f" --batch {known.batch}")
    if known.batch != 1 and not any(a.startswith("--out") for a in rest):
        rest += ["--out", str(bench_hierarchical.RESULTS / f"bench_models_{known.batch}.json")]
    return bench_hierarchical.main(rest, problems=BATCHES[known.batch](), script=script,
                                   methods=("sgld", "sghmc"), description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
