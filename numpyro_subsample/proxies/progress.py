"""Progress bars of the proxy fits (tqdm), closed so that an early stop reads as one."""

from __future__ import annotations

from tqdm.auto import tqdm

__all__ = ["finish_bar", "progress_bar"]


def progress_bar(total: int, desc: str, enabled: bool) -> tqdm:
    """A tqdm bar of ``total`` iterations (nothing is printed unless ``enabled``)."""
    return tqdm(total=int(total), desc=desc, disable=not enabled)


def finish_bar(bar: tqdm, note: str | None = None) -> None:
    """Close ``bar`` at 100 %: an iteration that stopped before ``total`` (converged, or
    stopped for the reason ``note`` gives) shows the steps done as the total and ``note``,
    instead of a bar left part-way, which reads as a crash."""
    if not bar.disable and bar.n < bar.total:
        bar.total = bar.n
    if note and not bar.disable:
        bar.set_postfix_str(note, refresh=False)
    bar.refresh()
    bar.close()
