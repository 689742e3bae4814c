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
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_hierarchical  # noqa: E402
from _unseen_models import suite  # noqa: E402


def main(argv=None) -> int:
    return bench_hierarchical.main(argv, problems=suite(), script="bench_models.py",
                                   methods=("sgld", "sghmc"), description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
