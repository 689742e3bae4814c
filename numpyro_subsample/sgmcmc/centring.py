"""Partial centring of a hierarchical model's loc-scale sites, from the kernel's adapted proxy.

A group effect a_j ~ N(m, s²) can be sampled centred (a_j itself) or non-centred
(ã_j = (a_j − m)/s). Neither suits groups of very unequal sizes: a group with much data pins a_j
(centred is better), a group with little data leaves a_j at its prior (non-centred is better).
Partial centring (Papaspiliopoulos, Roberts and Sköld 2007; Gorinova, Moore and Hoffman 2020,
Sect. 3, which NumPyro's :class:`~numpyro.infer.reparam.LocScaleReparam` implements) samples

    ã_j = (a_j − c_j m) / s^(1 − c_j),    0 ≤ c_j ≤ 1,

and for a Gaussian likelihood the posterior of ã_j is closest to independent of (m, s) at

    c_j = 1 − Var(a_j | y, m, s) / s²

(Papaspiliopoulos et al. 2007, Sect. 3: c_j = n_j s²/σ² / (1 + n_j s²/σ²) for a normal
likelihood with n_j rows of noise σ). :func:`centring_weights` estimates it with the kernel's
adapted proxy of the centred model (:mod:`~numpyro_subsample.sgmcmc.warmup`): Var(a_j | y, m, s)
as the proxy's conditional variance of a_j given every other coordinate, 1/(Σ⁻¹)_jj, which is
that of the formula where the groups are independent given (m, s), and s² averaged over its
draws. The proxy's marginal variance Σ_jj, which the weights were taken from before, also holds
what a_j shares with other coordinates: a non-identified shift between crossed effects and
the intercept (crossed groupings of 30 and 12 levels: c 0.91 against 0.99, and the scale of
the 12 levels came out 0.17 too wide in log-sd), or a random walk's increments, which the
data pin only in sums (c 0.7 against 1). :func:`partially_centred` returns the model
reparameterised with these weights, whose draws hold the model's own sites (a_j as a
deterministic site) beside the new ``<site>_partially_centred``.

A model the user wrote reparameterised, ``reparam(model, {a: LocScaleReparam(centered=c_u)})``
(non-centred for c_u = 0), is unwrapped (:func:`written_form`): the weights are estimated on
its centred form ``model`` and the kernel samples that with :class:`PartialCentring`, which
also returns the user's ``a_decentered`` as a deterministic site, so that the draws hold every
site of the model as the user wrote it.

Group effects written non-centred by hand, ``z ~ Normal(0, 1)`` in a group plate and
``a = m + s * z`` in the body (or a ``LocScaleReparam`` applied inside the body), are found by
two exact invariances of the rest of the log density (:func:`hand_forms`), sampled in their
centred form ``<z>_centred`` ~ Normal(m, s) (:class:`HandCentring`) for the weights, and then
partially centred like the others; z comes back as a deterministic site.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.extend.core import Literal
from numpyro.infer.reparam import LocScaleReparam, Reparam
from numpyro.infer.util import constrain_fn
from numpyro.primitives import Messenger

from numpyro_subsample.core.adapter import preprocess_keys
from numpyro_subsample.core.data import ModelData, device_array
from numpyro_subsample.core.potential import Potential, build_potential
from numpyro_subsample.core.structure import as_given
from numpyro_subsample.proxies.covariance import diag_precision, scale_matvec
from numpyro_subsample.proxies.structured import StructuredProxy

__all__ = ["HandCentring", "HandForm", "PartialCentring", "WrittenForm", "centred_form",
           "centred_potential", "centres", "centring_pays", "centring_weights", "has_group_scales",
           "hand_centred", "hand_forms",
           "hand_noncentred_remedy", "hand_noncentred_sites", "noncentred_potential",
           "rewritable_sites",
           "other_family_group_sites",
           "partially_centred", "partially_centred_potential", "weights_from",
           "weights_from_noncentred", "written_form"]

#: The site a partially centred group effect ``a`` is sampled as (``a`` is then deterministic).
NOISE_SUFFIX = "_partially_centred"
#: Weights from a non-centred proxy all below this leave the group effects non-centred (a
#: third preprocessing for a form this close to the second is not spent; a threshold, not a
#: measured optimum).
NONCENTRED_ENOUGH = 0.2
#: Sites whose weights are all at least this are left centred (reparameterising them would
#: change nothing measurable).
CENTRED_ENOUGH = 0.99

#: The partially centred form is sampled unless the step the kernel measures on it, or the
#: time its chain moves per draw, is below the centred form's over this (:func:`centring_pays`).
CENTRED_STEP_RATIO = 4.0


def _base_normal(fn) -> dist.Normal | None:
    """The Normal under a site's expand / to_event wrappers, or None."""
    while isinstance(fn, (dist.ExpandedDistribution, dist.Independent)):
        fn = fn.base_dist
    return fn if type(fn) is dist.Normal else None


def _on_first_rows(model: Callable, potential, plate_name: str) -> Callable:
    """``model`` seeded, with the subsample plate ``plate_name`` fixed to its first rows (a
    random subsample would compile its sampler at every eager call)."""
    rows = device_array(np.arange(potential.plate.subsample_size), np.int32)
    return numpyro.handlers.substitute(numpyro.handlers.seed(model, rng_seed=0),
                                       data={plate_name: rows})


def _normals_outside(tr, plate_name: str):
    """``(name, site, normal)`` for each latent sample site of the trace ``tr`` outside the
    subsample plate ``plate_name`` whose distribution is a Normal (:func:`_base_normal`)."""
    for name, site in tr.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        if any(f.name == plate_name for f in site["cond_indep_stack"]):
            continue
        normal = _base_normal(site["fn"])
        if normal is not None:
            yield name, site, normal


def _site_scales(model: Callable, potential, plate_name: str) -> Callable:
    """``scales(theta, args, kwargs)``: each latent Normal site's scale (broadcast to the
    site's shape) at the flat unconstrained ``theta``, for the sites outside the subsample plate
    ``plate_name``. The plate's subsample is fixed to its first rows: the scales do not depend
    on it."""
    seeded = _on_first_rows(model, potential, plate_name)

    def scales(theta, args, kwargs):
        latent = constrain_fn(seeded, args, kwargs, potential.unravel(theta))
        with numpyro.handlers.block():
            tr = numpyro.handlers.trace(numpyro.handlers.substitute(seeded, data=latent)
                                        ).get_trace(*args, **kwargs)
        return {name: jnp.broadcast_to(normal.scale, jnp.shape(site["value"]))
                for name, site, normal in _normals_outside(tr, plate_name) if name in latent}

    return scales


def _latent_scale_sites(scales: Callable, theta, args: tuple, kwargs: dict) -> set[str]:
    """The sites whose scale (``scales``, :func:`_site_scales`) depends on θ: a dependency walk
    over the jaxpr of ``scales`` (traced at ``theta``, not compiled)."""
    closed, shapes = jax.make_jaxpr(lambda t: scales(t, args, kwargs), return_shape=True)(theta)
    jaxpr = closed.jaxpr
    depends = set(jaxpr.invars)
    for eqn in jaxpr.eqns:  # a call or control-flow equation counts as one: conservative
        if any(not isinstance(v, Literal) and v in depends for v in eqn.invars):
            depends.update(eqn.outvars)
    names = jax.tree.leaves(jax.tree.map(lambda _, name: name, shapes,
                                         {k: k for k in shapes}))
    return {name for name, v in zip(names, jaxpr.outvars, strict=True)
            if not isinstance(v, Literal) and v in depends}


def has_group_scales(potential: Potential, data: ModelData) -> bool:
    """Whether the model has a latent Normal site outside the subsample plate whose scale is
    latent (a hierarchical group scale): traced, nothing compiled."""
    model_args, model_kwargs = data.args_kwargs()
    scales = _site_scales(potential.model, potential, potential.plate.name)
    return bool(_latent_scale_sites(scales, potential.init_theta, model_args,
                                    dict(model_kwargs)))


def _all_equal(x, value: float) -> bool:
    """Whether ``x`` is concrete (a constant of the model, not traced) and all ``value``."""
    try:
        return bool(np.all(np.asarray(x) == value))
    except jax.errors.TracerArrayConversionError:
        return False


def _sites_on_first_rows(potential: Potential, data: ModelData, pick) -> tuple[str, ...]:
    """The site names ``pick(trace)`` yields from one trace of the model on the plate's first
    rows (traced, not run: nothing compiled); () where the trace fails."""
    seeded = _on_first_rows(potential.model, potential, potential.plate.name)
    found = []

    def find(d):
        args, kwargs = d.args_kwargs()
        with numpyro.handlers.block():
            tr = numpyro.handlers.trace(seeded).get_trace(*args, **dict(kwargs))
        found.extend(pick(tr))
        return jnp.zeros(())

    try:
        jax.make_jaxpr(find)(data)
    except Exception:  # noqa: BLE001  (a model that cannot be traced on its first rows)
        return ()
    return tuple(found)


def hand_noncentred_sites(potential: Potential, data: ModelData) -> tuple[str, ...]:
    """The latent sites that look like group effects written non-centred by hand: a standard
    Normal(0, 1) site of several values in a plate other than the subsample plate (``z`` of
    ``a = m + s * z``), which partial centring cannot see (it needs ``a ~ Normal(m, s)``), or
    the noise ``<a>_decentered`` of a ``LocScaleReparam`` applied inside the model's body
    (its loc and scale are traced values). One trace of the model on the plate's first rows
    (:func:`_sites_on_first_rows`)."""
    def pick(tr):
        return (name for name, site, normal in _normals_outside(tr, potential.plate.name)
                if not name.endswith(NOISE_SUFFIX)  # the kernels' own
                and site["cond_indep_stack"] and np.size(site["value"]) >= 2
                and (name.endswith("_decentered")  # a LocScaleReparam inside the body
                     or _all_equal(normal.loc, 0.0) and _all_equal(normal.scale, 1.0)))

    return _sites_on_first_rows(potential, data, pick)


def rewritable_sites(potential: Potential, data: ModelData) -> tuple[str, ...]:
    """The sites of :func:`hand_noncentred_sites` that :func:`hand_noncentred_remedy` advises
    rewriting: not the noise ``<a>_decentered`` of a ``LocScaleReparam`` the user applied
    outside the model's body (:func:`written_form`), which is written as advised."""
    found = _written_sites(as_given(potential.model))
    outside = {f"{site}_decentered" for site in (found[1] if found else ())}
    return tuple(s for s in hand_noncentred_sites(potential, data) if s not in outside)


def other_family_group_sites(potential: Potential, data: ModelData) -> tuple[str, ...]:
    """The latent sites of several values in a plate other than the subsample plate whose prior
    is not a Normal and has a parameter that is not a constant of the model: group effects of
    another family (Gamma frailties, Beta rates, LogNormal discriminations), which partial
    centring cannot see. One trace of the model on the plate's first rows
    (:func:`_sites_on_first_rows`)."""
    def pick(tr):
        for name, site in tr.items():
            if (site["type"] != "sample" or site["is_observed"] or name not in
                    potential.latent_sites or not site["cond_indep_stack"]
                    or any(f.name == potential.plate.name for f in site["cond_indep_stack"])
                    or np.size(site["value"]) < 2 or _base_normal(site["fn"]) is not None):
                continue
            fn = site["fn"]
            while hasattr(fn, "base_dist") and not isinstance(fn, dist.TransformedDistribution):
                fn = fn.base_dist
            params = [getattr(fn, k, None) for k in getattr(fn, "arg_constraints", {})]
            if any(isinstance(v, jax.core.Tracer) for v in params):
                yield name

    return _sites_on_first_rows(potential, data, pick)


def hand_noncentred_remedy(sites: tuple[str, ...]) -> str:
    """The advice for the group effects :func:`hand_noncentred_sites` found: a
    ``LocScaleReparam`` applied inside the model's body (its ``<a>_decentered`` sites), or a
    non-centring written by hand."""
    inside = [s.removesuffix("_decentered") for s in sites if s.endswith("_decentered")]
    by_hand = [s for s in sites if not s.endswith("_decentered")]
    tips = []
    if inside:
        names = ", ".join(inside)
        tips.append(
            f"apply the LocScaleReparam of {names} outside the model's body, "
            f"reparam(model, config={{'{inside[0]}': LocScaleReparam(0)}}), or write {names} "
            "centred: inside the body it hides the group effects from the kernels, which "
            "otherwise sample them partially centred per group")
    if by_hand:
        tips.append(
            f"write the group effects of {', '.join(by_hand)} as a sample site, a ~ "
            "Normal(m, s) (centred, or non-centred with reparam(model, {'a': "
            "LocScaleReparam(0)}) outside the model's body: the kernels then sample it "
            "partially centred per group) or a centred a ~ MultivariateNormal(m, "
            "scale_tril=...): the kernels centre a = m + s * z written by hand only where s "
            "(and m) are sample sites used in the likelihood through a alone")
    return ("; ".join(tips) + " (a non-centred group effect of a well-observed group lies "
            "on a curved ridge z ≈ (a − m)/s that a Gaussian proxy whitens poorly, and every "
            "group's z enters the shared parameters' gradients; docs/adapted_proxy.md)")



class HandForm(NamedTuple):
    """How the model uses a group effect written non-centred by hand, ``a = m + s * z``: the
    latent sites of m (None: no site, m = 0) and of s (:func:`hand_forms`)."""

    loc: str | None
    scale: str


#: Relative size, against the change a shift of z alone makes, below which a change of the
#: rest of the log density counts as none (float32 sums over a subsample's rows)
_INVARIANT = 1e-3


def _site_terms(seeded: Callable) -> Callable:
    """``terms(values, data)``: each sample site's log density (scaled, masked) of the seeded
    model at the constrained ``values``, summed; one compiled program, the data an
    argument."""

    @jax.jit
    def terms(values, data):
        args, kwargs = data.args_kwargs()
        with numpyro.handlers.block():
            tr = numpyro.handlers.trace(numpyro.handlers.substitute(seeded, data=values)
                                        ).get_trace(*args, **dict(kwargs))
        out = {}
        for name, site in tr.items():
            if site["type"] == "sample":
                lp = site["fn"].log_prob(site["value"])
                if site.get("mask") is not None:
                    lp = jnp.where(site["mask"], lp, 0.0)
                out[name] = jnp.sum(lp) * (1.0 if site.get("scale") is None else site["scale"])
        return out

    return terms


def _invariant(terms, data, skip: set[str], base: dict, changed: dict, control: dict) -> bool:
    """Whether moving from ``base`` to ``changed`` leaves the log density without the terms
    of ``skip`` unchanged, relative to the change that moving to ``control`` makes (which
    must be clearly non-zero)."""

    def rest(values):
        t = jax.device_get(terms(values, data))
        return float(sum(np.float64(v) for k, v in t.items() if k not in skip)), float(
            sum(abs(np.float64(v)) for v in t.values()))

    f0, size = rest(base)
    reference = abs(rest(control)[0] - f0)
    delta = abs(rest(changed)[0] - f0)
    floor = 1e-5 * (size + 1.0)
    return bool(np.isfinite(delta) and reference > 10 * floor
                and delta <= max(_INVARIANT * reference, floor))


def hand_forms(potential: Potential, data: ModelData) -> dict[str, HandForm]:
    """The sites m and s of each group effect written non-centred by hand, ``a = m + s * z``
    with ``z`` a site of :func:`hand_noncentred_sites`, found by the two invariances of the
    rest of the log density (every term but the priors of z, m and s) that this use implies:
    (s, z) → (r s, z / r) and (m, z) → (m + δ, z − δ / s). s: a positive latent site whose
    shape broadcasts to z's; m: a latent site so, or None where no site passes the second
    test (then the centred form samples s * z, the group effect less its mean). Evaluated
    at the potential's start on the subsample plate's first rows (one compiled program);
    {} where no z passes the first test."""
    sites = hand_noncentred_sites(potential, data)
    if not sites:
        return {}
    seeded = _on_first_rows(potential.model, potential, potential.plate.name)
    terms = _site_terms(seeded)
    base = jax.jit(lambda theta, d: constrain_fn(seeded, *d.args_kwargs(),
                                                 potential.unravel(theta)))(
        potential.init_theta, data)
    shapes = jax.eval_shape(terms, base, data)
    latent = [n for n in base if n in shapes and n not in sites]
    forms = {}
    for z in sites:
        zv = base[z]

        def fits(name, zv=zv):
            try:
                return np.broadcast_shapes(jnp.shape(base[name]), zv.shape) == zv.shape
            except ValueError:
                return False

        others = [n for n in latent if n not in forms and fits(n)]
        control = {**base, z: zv + 1.0}
        scale = next((s for s in others if bool(jnp.all(base[s] > 0)) and _invariant(
            terms, data, {z, s}, base, {**base, s: 1.25 * base[s], z: zv / 1.25}, control)),
            None)
        if scale is None:
            continue
        sv = base[scale]
        delta = 0.5 * jnp.mean(sv)
        loc = next((m for m in others if m != scale and _invariant(
            terms, data, {z, scale, m}, base,
            {**base, m: base[m] + delta, z: zv - delta / sv}, control)), None)
        forms[z] = HandForm(loc, scale)
    if forms:  # m and s must be sampled before z: the centred form must trace
        try:
            values = {f"{z}_centred": base[z] for z in forms} | {
                k: v for k, v in base.items() if k not in forms}
            jax.eval_shape(_site_terms(_on_first_rows(hand_centred(potential.model, forms),
                                                      potential, potential.plate.name)),
                           values, data)
        except Exception:  # noqa: BLE001
            return {}
    return forms


class _Latest(Messenger):
    """Keeps the values of the sample sites ``names`` in ``values`` (emptied at each run of
    the model), for :class:`HandCentring`."""

    def __init__(self, fn: Callable, values: dict, names: set[str]) -> None:
        self.values, self.names = values, names
        super().__init__(fn)

    def __enter__(self):
        self.values.clear()
        return super().__enter__()

    def postprocess_message(self, msg) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            self.values[msg["name"]] = msg["value"]


class HandCentring(Reparam):
    """The centred form of a group effect written non-centred by hand: the standard Normal
    site ``z`` of ``a = m + s * z`` is sampled as ``<z>_centred`` ~ Normal(m, s), the group
    effect itself, and returned as z = (a − m)/s (a deterministic site). The same posterior
    (Papaspiliopoulos, Roberts and Sköld 2007, Sect. 2); m and s are the current values of
    the sites ``form`` names (:func:`hand_centred` records them)."""

    def __init__(self, values: dict, form: HandForm) -> None:
        self.values, self.form = values, form

    def __call__(self, name, fn, obs):
        if obs is not None:
            raise ValueError(f"HandCentring applies to latent sites; site {name!r} is "
                             "observed.")
        _, expand_shape, event_dim = self._unwrap(fn)
        m = 0.0 if self.form.loc is None else self.values[self.form.loc]
        s = self.values[self.form.scale]
        a = numpyro.sample(f"{name}_centred",
                           self._wrap(dist.Normal(m, s), expand_shape, event_dim))
        return None, (a - m) / s


def hand_centred(model: Callable, forms: dict[str, HandForm]) -> Callable:
    """``model`` with each hand-written non-centred site of ``forms`` (:func:`hand_forms`)
    sampled centred (:class:`HandCentring`)."""
    values: dict = {}
    names = {n for f in forms.values() for n in (f.loc, f.scale) if n is not None}
    return numpyro.handlers.reparam(_Latest(model, values, names),
                                    config={z: HandCentring(values, f) for z, f in forms.items()})


def centred_form(model: Callable, data: ModelData, seed: int = 0,
                 potential_of: Callable[[], Potential] | None = None) -> WrittenForm | None:
    """The centred form the kernels preprocess first: of a model the user wrote
    reparameterised (:func:`written_form`), or of one with group effects non-centred by hand
    (:func:`hand_forms`, :func:`hand_centred`; ``written`` then empty); None where neither.
    ``potential_of`` gives the potential of ``model`` where the hand-written forms are
    looked for (a kernel's cached one); default: built here."""
    form = written_form(model, data)
    if form is not None or _reparameterised(model):
        return form
    potential = (build_potential(model, data, preprocess_keys(seed)[0])
                 if potential_of is None else potential_of())
    if potential.plate_latent_sites:
        return None
    forms = hand_forms(potential, data)
    return (WrittenForm(hand_centred(model, forms), {}, tuple(f"{z}_centred" for z in forms))
            if forms else None)

def weights_from(proxy, potential, data: ModelData, *, num_draws: int = 64,
                 seed: int = 0, keep: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """:func:`centring_weights` from a Gaussian ``proxy`` (dense or structured) of
    ``potential`` (the model in its centred form) on ``data``; the sites ``keep`` (latent
    Normal sites outside the subsample plate) get their weights whatever their values and
    scales."""
    model_args, model_kwargs = data.args_kwargs()
    model_kwargs = dict(model_kwargs)
    dtype = potential.init_theta.dtype
    scales = _site_scales(potential.model, potential, potential.plate.name)
    # most models have no latent scale: found from the traced program, nothing compiled
    if not keep and not _latent_scale_sites(scales, potential.init_theta, model_args,
                                            model_kwargs):
        return {}
    centre = np.asarray(proxy.centre, np.float64)
    index = potential.unravel(jnp.arange(centre.shape[0]).astype(dtype))
    z = np.random.default_rng(seed).normal(size=(num_draws, centre.shape[0]))
    if isinstance(proxy, StructuredProxy):  # O(d·k): no d × d matrix
        draws = centre + np.asarray(scale_matvec(proxy.cov_op, jnp.asarray(z, dtype)), np.float64)
        # Var(a_j | y, the rest) of the Gaussian proxy: 1 / (its precision's diagonal)
        variance = 1.0 / np.asarray(diag_precision(proxy.cov_op), np.float64)
    else:
        cov = np.asarray(proxy.cov, np.float64)
        draws = centre + z @ np.linalg.cholesky(0.5 * (cov + cov.T)).T
        variance = 1.0 / np.diag(np.linalg.inv(0.5 * (cov + cov.T)))
    # the data enter the program as an argument (ModelData: arrays as leaves, the rest static)
    sums = jax.device_get(jax.jit(jax.vmap(
        lambda theta, d: scales(theta, *d.args_kwargs()), in_axes=(0, None)))(
        jnp.asarray(draws, dtype), data))
    weights = {}
    for name, site_scales in sums.items():
        site_scales = np.asarray(site_scales, np.float64)
        if name not in keep and np.allclose(site_scales, site_scales[0]):
            continue  # a fixed scale: centring changes nothing
        idx = np.asarray(index[name]).astype(int)
        c = np.clip(1.0 - variance[idx] / np.mean(site_scales ** 2, axis=0), 0.0, 1.0)
        if name in keep or np.any(c < CENTRED_ENOUGH):
            weights[name] = c
    return weights


def centring_weights(kernel, model_args: tuple = (), model_kwargs: dict | None = None, *,
                     num_draws: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """The partial-centring weights c of the model's centred Gaussian group effects.

    The SG kernels use them by default (``AdaptationOptions(centring=None)``); this function
    gives them for inspection or for another sampler.

    Parameters
    ----------
    kernel
        An SG kernel of the package (e.g. ``SGLD(model)``) with its default adapted proxy;
        the model as written is preprocessed on the data (a copy of the kernel, with partial
        centring off).
    model_args, model_kwargs
        The model's data, as given to ``MCMC.run``.
    num_draws
        Draws of the proxy at which each site's scale s is evaluated (E s² over them).
    seed
        Seed of those draws.

    Returns
    -------
    dict
        ``{site: c}`` with ``c`` of the site's shape in [0, 1], for each latent Normal site
        outside the subsample plate whose scale depends on other latent sites and whose
        weights are not all above ``CENTRED_ENOUGH``; empty where there is none.

    References
    ----------
    Papaspiliopoulos, O., Roberts, G. O. and Sköld, M. (2007). A general framework for the
    parametrization of hierarchical models. Statistical Science 22(1), Sect. 3.
    Gorinova, M., Moore, D. and Hoffman, M. (2020). Automatic reparameterisation of
    probabilistic programs. ICML, Sect. 3.
    """
    data = ModelData.from_args(model_args, model_kwargs)
    form = centred_form(kernel.user_model, data, kernel.seed)
    kernel = kernel.without_centring(None if form is None else form.model)
    pre = kernel._preprocess_data(data)
    proxy = pre.proxy
    if proxy is None or (getattr(proxy, "cov", None) is None
                         and not isinstance(proxy, StructuredProxy)):
        raise ValueError(
            f"centring_weights needs a kernel with a Gaussian proxy; "
            f"{type(kernel).__name__}'s proxy is {getattr(proxy, 'kind', None)!r}. Use SGLD, "
            "SGHMC or SGNHT with the default proxy.")
    potential = kernel.potential_for(data)
    if potential.plate_latent_sites:
        raise ValueError("centring_weights does not apply to models with local latent sites "
                         f"({list(potential.plate_latent_sites)}).")
    return weights_from(proxy, potential, data, num_draws=num_draws, seed=seed,
                        keep=() if form is None else tuple(form.written))


class PartialCentring(LocScaleReparam):
    """NumPyro's ``LocScaleReparam(centered=c)`` (Gorinova, Moore and Hoffman 2020, Sect. 3)
    whose noise is the site ``<name>_partially_centred``; for a site that the user wrote
    reparameterised with weights ``written`` (c_u), it also records the user's noise
    ``<name>_decentered`` = (a − m)/s^(1 − c_u) + c_u m as a deterministic site.

    Parameters
    ----------
    centered
        The weights c in [0, 1], of the site's shape (1 is kept as a reparameterisation:
        the noise is then a itself).
    written
        The user's weights c_u, or None where the user wrote the site centred.

    References
    ----------
    Gorinova, M., Moore, D. and Hoffman, M. (2020). Automatic reparameterisation of
    probabilistic programs. ICML, Sect. 3.
    """

    def __init__(self, centered, written=None) -> None:
        super().__init__(centered=centered)
        self.written = written

    def __call__(self, name, fn, obs):
        if obs is not None:
            raise ValueError(f"PartialCentring applies to latent sites; site {name!r} is "
                             "observed.")
        base, expand_shape, event_dim = self._unwrap(fn)
        c = jnp.asarray(self.centered)
        noise_fn = self._wrap(type(base)(loc=base.loc * c, scale=base.scale ** c),
                              expand_shape, event_dim)
        noise = numpyro.sample(f"{name}{NOISE_SUFFIX}", noise_fn)
        value = base.loc + base.scale ** (1 - c) * (noise - c * base.loc)
        if self.written is not None:
            w = jnp.asarray(self.written)
            numpyro.deterministic(f"{name}_decentered",
                                  (value - base.loc) / base.scale ** (1 - w) + w * base.loc)
        return None, value


class WrittenForm(NamedTuple):
    """The centred form of a model the user wrote non-centred: as ``reparam(model, config)``
    with loc-scale sites (:func:`written_form`; ``model`` keeps the other entries of
    ``config``, ``written`` holds the user's weights per unwrapped site), or by hand
    (:func:`centred_form`; ``hand`` names the centred sites ``<z>_centred``)."""

    model: Callable
    written: dict
    hand: tuple[str, ...] = ()


def _written_sites(model) -> tuple[Callable, dict, dict] | None:
    """(innermost model, loc-scale entries {site: c_u}, other entries) of a chain of reparam
    handlers with dict configs, or None where there is none or one cannot be unwrapped."""
    written, others = {}, {}
    while isinstance(model, numpyro.handlers.reparam):
        config = model.config
        if not isinstance(config, dict):
            return None  # a callable config may reparameterise any site
        for site, rep in config.items():
            if site in written or site in others:
                return None  # reparameterised twice: the order of the handlers matters
            if (isinstance(rep, LocScaleReparam) and not isinstance(rep, PartialCentring)
                    and rep.centered is not None and not rep.shape_params):
                written[site] = np.asarray(rep.centered, np.float64)
            else:
                others[site] = rep
        model = model.fn
    return (model, written, others) if written else None


def written_form(model: Callable, data: ModelData) -> WrittenForm | None:
    """The centred form of a model the user wrote as ``reparam(model, {a:
    LocScaleReparam(centered=c_u)})`` (nested reparam handlers with dict configs included),
    for the sites ``a`` that are latent Normal sites; None where the model has no such
    handler, or where it reparameterises other distributions or sites through a callable
    config. (Sites inside the subsample plate make the potential local, which partial
    centring leaves as written.)"""
    found = _written_sites(model)
    if found is None:
        return None
    inner, written, others = found
    centred = numpyro.handlers.reparam(inner, config=others) if others else inner
    args, kwargs = data.args_kwargs()
    usable = {}

    def check_sites():  # traced, not run: the model's subsample would compile eager programs
        with numpyro.handlers.block():
            tr = numpyro.handlers.trace(numpyro.handlers.seed(centred, rng_seed=0)).get_trace(
                *args, **dict(kwargs))
        for site in written:
            msg = tr.get(site)
            usable[site] = (msg is not None and msg["type"] == "sample"
                            and not msg["is_observed"] and _base_normal(msg["fn"]) is not None)
        return jnp.zeros(())

    jax.make_jaxpr(check_sites)()
    return WrittenForm(centred, written) if all(usable.values()) else None


def partially_centred(model: Callable, weights: dict[str, np.ndarray]) -> Callable:
    """``model`` with each site of ``weights`` reparameterised by
    ``LocScaleReparam(centered=c)`` (:func:`centring_weights`); the model itself where
    ``weights`` is empty.

    Parameters
    ----------
    model
        The NumPyro model, with its group effects written centred.
    weights
        ``{site: c}``, c in [0, 1] of the site's shape.

    Returns
    -------
    callable
        The reparameterised model (:class:`PartialCentring`): the same posterior, each site
        ``a`` sampled as ``a_partially_centred`` and returned as a deterministic site ``a``.

    References
    ----------
    Gorinova, M., Moore, D. and Hoffman, M. (2020). Automatic reparameterisation of
    probabilistic programs. ICML, Sect. 3.
    """
    if not weights:
        return model
    config = {name: PartialCentring(jnp.asarray(c)) for name, c in weights.items()}
    return numpyro.handlers.reparam(model, config=config)


def _reparameterised(model) -> bool:
    """Whether ``model`` is wrapped by a reparam handler with a loc-scale reparameterisation
    (by the user, or by :func:`partially_centred`) or a callable config."""
    while model is not None:
        if isinstance(model, numpyro.handlers.reparam):
            config = model.config
            if callable(config) or any(isinstance(r, LocScaleReparam)
                                       for r in (config or {}).values()):
                return True  # a callable config may reparameterise any site
        model = getattr(model, "fn", None)
    return False


def _pilot_ran(proxy) -> bool:
    """Whether pilot chains adapted ``proxy``, or ran and kept it (a trusted start that no
    window disagreed with: :func:`~numpyro_subsample.sgmcmc.warmup.adapt_proxy`)."""
    return proxy.kind == "adapted" or "windows" in (proxy.info or {})


def centres(kernel) -> bool:
    """Whether ``kernel`` may sample a model partially centred (its ``centring`` option and
    its support for proxy adaptation)."""
    return (getattr(kernel, "centring", False) is not False
            and getattr(kernel, "supports_proxy_adaptation", False))


def unwrapped(kernel, data: ModelData) -> tuple[WrittenForm, Potential] | None:
    """The model the user wrote non-centred in its centred form (:func:`centred_form`) and
    its potential, which the kernel preprocesses first, where partial centring applies to
    it; None: the model is preprocessed as written."""
    if not centres(kernel):
        return None
    form = centred_form(kernel.user_model, data, kernel.seed,
                        potential_of=lambda: kernel.potential_for(data))
    if form is None:
        return None
    potential = build_potential(form.model, data, preprocess_keys(kernel.seed)[0])
    if potential.local or (kernel.centring is None and not kernel._adapts_proxy(potential, data)):
        return None
    return form, potential


def _time_per_draw(pre) -> float:
    """h · k: the time the chain moves per draw, k the steps per draw
    (:func:`~numpyro_subsample.sgmcmc.stepsize.steps_per_draw`; 1 where not set)."""
    k = pre.params.steps_per_draw if hasattr(pre, "params") else None
    return float(pre.step_size) * (1 if k is None else int(k))


def centring_pays(centred, partial) -> bool:
    """Whether to sample the partially centred form, whose preprocessing is ``partial``,
    rather than the centred form's ``centred``: unless both steps come from the kernel's rule
    (``noise_free_step`` known) and the partially centred one, or the time h · k its chain
    moves per draw (k steps per draw), is below the centred one's over
    :data:`CENTRED_STEP_RATIO`.

    The weights come from a Gaussian proxy of a posterior that need not be Gaussian; where
    they misjudge it, the partially centred form can be much harder to sample than the centred
    one (a spline's random-walk increments weighted by their marginal variances, c ≈ 0.7: the
    control variates' noise at the proxy's draws grew from 0.06 to 265 and the step fell
    from 0.026 to 0.0024). The measured steps, which hold the curvature and the noise, decide.
    The time per draw counts where the steps per draw differ: on hierarchical AR(1) series
    (``bench_models.py --batch 7``, ar-groups) the centred form's step 0.0067 ran k = 8 steps
    per draw, the partially centred form's 0.0040 one (too far below the unit step for the
    capped k to make it mix), and its run reached an ESS of 9 against 393.
    """
    measured = (np.isfinite(centred.noise_free_step) and np.isfinite(partial.noise_free_step))
    return not (measured and (
        partial.step_size * CENTRED_STEP_RATIO < centred.step_size
        or _time_per_draw(partial) * CENTRED_STEP_RATIO < _time_per_draw(centred)))


def noncentred_potential(kernel, potential: Potential, data: ModelData) -> Potential | None:
    """The potential of the user's model with each group effect whose scale is latent
    non-centred (weight c = 0, :func:`partially_centred`): the form a kernel falls back to
    where the model as written cannot be preprocessed (a joint mode in the neck of the group
    scale's funnel, which a scale prior that vanishes at 0, such as a LogNormal, keeps finite,
    and whose proxy's draws overflow). None where centring is off, the model is
    reparameterised or has local latent sites, or no Normal site has a latent scale."""
    if (not centres(kernel) or potential.plate_latent_sites
            or as_given(potential.model) is not kernel.user_model
            or _reparameterised(kernel.user_model)):
        return None
    model_args, model_kwargs = data.args_kwargs()
    scales = _site_scales(potential.model, potential, potential.plate.name)
    sites = _latent_scale_sites(scales, potential.init_theta, model_args, dict(model_kwargs))
    if not sites:
        return None
    values = potential.unravel(potential.init_theta)
    return partially_centred_potential(
        kernel, {name: np.zeros(np.shape(values[name])) for name in sorted(sites)}, data)


def partially_centred_potential(kernel, weights: dict[str, np.ndarray],
                                data: ModelData) -> Potential:
    """The potential of the kernel's model partially centred at ``weights``
    (:func:`partially_centred`)."""
    return build_potential(partially_centred(kernel.user_model, weights), data,
                           preprocess_keys(kernel.seed)[0])


def weights_from_noncentred(pre) -> dict[str, np.ndarray]:
    """Partial-centring weights from the dense Gaussian proxy of a model whose group effects
    are sampled non-centred (:func:`noncentred_potential`): c_j = 1 − Var(z_j | rest), the
    proxy's conditional variance of the standardised effect z_j = (a_j − m)/s, which is
    1 − Var(a_j | rest)/s² of :func:`weights_from` at a given scale s (Gorinova, Moore and
    Hoffman 2020, Sect. 3). Empty without a dense proxy or where every weight is below
    ``NONCENTRED_ENOUGH``."""
    proxy, potential = pre.proxy, pre.potential
    cov = None if proxy is None else getattr(proxy, "cov", None)
    if cov is None or isinstance(proxy, StructuredProxy):
        return {}
    cov = np.asarray(cov, np.float64)
    conditional = 1.0 / np.diag(np.linalg.inv(0.5 * (cov + cov.T)))
    index = potential.unravel(jnp.arange(cov.shape[0]).astype(potential.init_theta.dtype))
    weights = {}
    for name, idx in index.items():
        if name.endswith(NOISE_SUFFIX):
            c = np.clip(1.0 - conditional[np.asarray(idx).astype(int)], 0.0, 1.0)
            weights[name.removesuffix(NOISE_SUFFIX)] = c
    return weights if any(np.any(c >= NONCENTRED_ENOUGH) for c in weights.values()) else {}


def centred_potential(kernel, pre, data: ModelData,
                      form: WrittenForm | None = None, *, centred: bool = False
                      ) -> Potential | None:
    """The potential of the model partially centred with the weights of ``pre``'s proxy
    (:func:`weights_from`), for a kernel whose ``AdaptationOptions.centring`` allows it;
    ``centred``: with every weight 1 (the centred form of a ``form``, whose draws hold the
    user's sites; None without ``form``, ``pre``'s potential being that form).

    With ``form`` (``pre`` is of its centred model), the user's loc-scale sites and
    hand-written group effects are sampled with :class:`PartialCentring` at the proxy's
    weights, or, where no pilot chains ran on the proxy, at the user's own. Without,
    None where centring is off, where the potential is already a centred one, where the
    model has a reparameterisation that :func:`written_form` does not unwrap, local latent
    sites or no Gaussian proxy that pilot chains ran on, or where no site has weights below
    ``CENTRED_ENOUGH``."""
    potential, proxy = pre.potential, pre.proxy
    if not centres(kernel) or potential.plate_latent_sites or (centred and form is None):
        return None
    if form is None and (as_given(potential.model) is not kernel.user_model
                         or _reparameterised(kernel.user_model)):
        return None
    gaussian = (proxy is not None
                and (getattr(proxy, "cov", None) is not None or isinstance(proxy, StructuredProxy))
                and (kernel.centring is True or _pilot_ran(proxy)))
    keep = () if form is None else (*form.written, *form.hand)
    weights = weights_from(proxy, potential, data, keep=keep) if gaussian else {}
    if centred:
        weights = dict.fromkeys((*weights, *keep), 1.0)
    if form is None:
        if not weights:
            return None
        model = partially_centred(kernel.user_model, weights)
    else:
        config = {site: PartialCentring(jnp.asarray(c)) for site, c in weights.items()}
        config.update({site: PartialCentring(jnp.asarray(weights.get(site, c_u)), written=c_u)
                       for site, c_u in form.written.items()})
        config.update({site: PartialCentring(jnp.asarray(weights.get(site, 0.0)))
                       for site in form.hand})
        model = numpyro.handlers.reparam(form.model, config=config)
    return build_potential(model, data, preprocess_keys(kernel.seed)[0])
