"""The SmolLM2 servers that tests in several files of tests/server/ ask for,
each started once for the whole run (a start costs seconds), and `server`:
the plain one, or the flags one for a test marked `with_flags`."""

from __future__ import annotations

import pytest

from api_helpers import ALIAS, TEMPLATE
from server_process import ServerProcess


def pytest_configure(config):
    config.addinivalue_line("markers", "with_flags: the test's `server` is `flags_server`, not `plain_server`")


@pytest.fixture(scope="session")
def plain_server(smollm2_path):
    """`ember serve` of SmolLM2 with no flag but the model's."""
    with ServerProcess(smollm2_path) as s:
        yield s


@pytest.fixture(scope="session")
def template_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    p.write_text(TEMPLATE, encoding="utf-8")
    return p


@pytest.fixture(scope="session")
def flags_server(smollm2_path, template_file):
    """One process for the flags that do not get in each other's way."""
    with ServerProcess(smollm2_path, "--metrics", "-a", ALIAS, "--chat-template-file", str(template_file),
                       "-n", "5", "-np", "2") as s:
        yield s


@pytest.fixture
def server(request):
    """`plain_server`, or `flags_server` for a test marked `with_flags`; a file
    that starts a server of its own defines its own `server` instead."""
    return request.getfixturevalue("flags_server" if request.node.get_closest_marker("with_flags") else "plain_server")
