"""The gate's Data Docs view compiles GX's templates once, not once per run."""

from __future__ import annotations

import glob
import os

from expectations import views
from expectations.gate import GxGate
from tests.support.gc import gate_frames


def _compiles(monkeypatch) -> list[str]:
    """Every template a :class:`CachedJinjaPageView` compiles from here on, by name."""
    compiled: list[str] = []
    made = views.CachedJinjaPageView.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        env_compile = self.env.compile

        def counting(source, name=None, filename=None, raw=False, defer_init=False):
            compiled.append(name)
            return env_compile(source, name, filename, raw, defer_init)

        self.env.compile = counting

    monkeypatch.setattr(views.CachedJinjaPageView, "__init__", init)
    return compiled


def test_a_second_gate_run_compiles_no_template_and_renders_the_same_pages(tmp_path, monkeypatch):
    os.mkdir(tmp_path / "jinja")
    monkeypatch.setattr(views, "_cache", [views.QuietBytecodeCache(str(tmp_path / "jinja"))])
    compiled = _compiles(monkeypatch)
    frames = gate_frames()
    first = GxGate(str(tmp_path / "a"))(frames)
    assert first.success and "page.j2" in compiled  # a cold cache: GX's templates compile
    assert os.listdir(tmp_path / "jinja")  # ... into the cache
    compiled.clear()
    second = GxGate(str(tmp_path / "b"))(frames)  # a new context, new views, the same templates
    assert second.success and compiled == []

    def pages(root):
        site = os.path.join(root, "gx", "uncommitted", "data_docs", "local_site")
        # (section, suite) of every page: the run names in the paths differ
        return sorted(
            tuple(os.path.relpath(p, site).split(os.sep)[:2]) for p in glob.glob(f"{site}/**/*.html", recursive=True)
        )

    assert pages(tmp_path / "a") == pages(tmp_path / "b")  # the same pages, from the cache
    html = glob.glob(f"{tmp_path / 'b'}/**/validations/partition_state/**/*.html", recursive=True)
    text = open(html[0], encoding="utf-8").read()
    assert "must always be greater than or equal to those in" in text  # GX's own rendering of an expectation


def test_a_cache_directory_removed_under_a_running_process_costs_a_compile_not_a_page(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "_cache", [views.QuietBytecodeCache(str(tmp_path / "gone"))])  # never made
    compiled = _compiles(monkeypatch)
    for report in ("a", "b"):
        compiled.clear()
        assert GxGate(str(tmp_path / report))(gate_frames()).success
        assert "page.j2" in compiled  # nothing cached: compiled every run, as before


def test_without_a_usable_temporary_directory_the_views_compile_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "_cache", [])
    monkeypatch.setattr(views, "QuietBytecodeCache", _refuses)
    assert views.bytecode_cache() is None
    assert GxGate(str(tmp_path / "report"))(gate_frames()).success


def _refuses(*args, **kwargs):
    raise RuntimeError("Cannot determine safe temp directory")  # what Jinja raises for an unsafe one
