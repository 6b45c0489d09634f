"""An HTML page template for ``dvc plots show`` that renders with no network.

DVC's page loads vega, vega-lite and vega-embed from a CDN (its ``{scripts}`` placeholder), so
offline it is blank. This template has no ``{scripts}`` placeholder: the three libraries are
inlined in one ``<script>`` (the bundle of ``vl-convert-python``, a PyPI package that ships them),
and DVC fills only ``{plot_divs}`` (and ``{refresh_tag}``). The ``run_report`` stage writes it to
``reports/dvc_plots_template.html``; the project's ``.dvc/config`` names it
(``plots.html_template``, set by ``hydra-ens run``), so a plain ``dvc plots show`` uses it, and
``dvc plots show --html-template reports/dvc_plots_template.html`` does the same anywhere.

Bundling takes seconds, so the bundle is kept per user (``$XDG_CACHE_HOME/hydra-ens`` or
``~/.cache/hydra-ens``), keyed by the vl-convert version and the vega-lite version asked for.
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra_ops.atomic import atomic_write_bytes

#: The vega-lite major.minor DVC's templates are written for (their ``$schema`` is v5).
VEGA_LITE_VERSION = "5.21"

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots (offline)</title>
<script>
%BUNDLE%
</script>
<script>
// DVC's plot divs call vegaEmbed(id, spec): draw as SVG (sharp, and its text is in the DOM) and
// offer only the actions that work offline (save as SVG or PNG; no online editor).
(function () {
  const embed = window.vegaEmbed;
  window.vegaEmbed = (el, spec, opt) => embed(el, spec, Object.assign(
    {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}},
    opt || {}));
})();
</script>
<style>
body { font-family: sans-serif; margin: 16px; }
table { border-spacing: 15px; }
</style>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hydra-ens"


def vega_bundle(vl_version: str = VEGA_LITE_VERSION) -> str:
    """vega + vega-lite ``vl_version`` + vega-embed as one classic script that sets the globals
    ``vega``, ``vegaLite`` and ``vegaEmbed`` (what DVC's plot divs call); cached per user."""
    from importlib.metadata import version

    import vl_convert

    path = cache_dir() / f"vega-bundle-{version('vl-convert-python')}-vl{vl_version}.js"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    bundle = vl_convert.javascript_bundle(vl_version=vl_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, bundle.encode("utf-8"), keep_suffix=False)
    return bundle


def page_template(bundle: str | None = None) -> str:
    """The page: :data:`PAGE` with ``bundle`` (default :func:`vega_bundle`) inlined. A ``</script``
    inside the bundle would end the script element early, so it is escaped as ``<\\/script``
    (the same string to JavaScript)."""
    js = vega_bundle() if bundle is None else bundle
    js = js.replace("</script", "<\\/script")
    if "{plot_divs}" in js or "{scripts}" in js:
        raise ValueError("the vega bundle holds a DVC placeholder; it cannot be inlined")
    return PAGE.replace("%BUNDLE%", js)
