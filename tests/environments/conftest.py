"""Fixtures of the environment tests."""

from __future__ import annotations

import pytest

from tests.support.guests import Spy


@pytest.fixture
def spy() -> Spy:
    return Spy()
