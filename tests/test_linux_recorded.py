"""minidl_course.linux_recorded: what 09 and 10 print where the platform can't show a Linux-only lesson."""

from __future__ import annotations

from minidl_course import linux_recorded, osfacts

MISSING = osfacts.Fact("the files a process holds open (/proc/<pid>/fd)", False, "no /proc on macOS or Windows")
PRESENT = osfacts.Fact("VmPTE from /proc/<pid>/status", True)


def test_missing_returns_the_first_fact_lacking_even_though_it_is_falsy():
    assert linux_recorded.missing(PRESENT, MISSING) is MISSING
    assert linux_recorded.missing(PRESENT, PRESENT) is None


def test_first_line_says_linux_only_and_why_not():
    line = linux_recorded.first_line(MISSING, "where batches live")
    assert line.startswith("Linux only: where batches live.")
    assert "can't show the files a process holds open" in line and "no /proc on macOS or Windows" in line
    assert linux_recorded.first_line(None, "where batches live").endswith("This machine can show it (measured below).")
    assert linux_recorded.first_line(PRESENT, "x").endswith("(measured below).")


def test_show_labels_every_text_with_the_machine_it_came_from(capsys):
    for name, text in linux_recorded.TEXTS.items():
        linux_recorded.show(name)
        out = capsys.readouterr().out
        assert out.startswith(f"--- committed Linux result ({linux_recorded.RUN}):\n")
        assert out.endswith(text + "\n")
    assert "Linux" in linux_recorded.RUN and "cores" in linux_recorded.RUN
