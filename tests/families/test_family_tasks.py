"""FAMILY_TASKS, the static table routing uses, agrees with every adapter class."""

from __future__ import annotations

import pytest

from fleetserve.catalog.names import FAMILY_NAMES
from fleetserve.families import FAMILIES, FAMILY_TASKS, family_class, family_tasks


def test_the_table_names_every_family() -> None:
    assert set(FAMILY_TASKS) == set(FAMILIES)


def test_the_catalog_knows_every_family_by_name_in_order() -> None:
    assert tuple(FAMILIES) == FAMILY_NAMES  # the order the catalog's errors list them


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_table_matches_the_adapter_class(family: str) -> None:
    assert family_tasks(family) == FAMILY_TASKS[family] == family_class(family).tasks


def test_an_unknown_family_is_a_value_error_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown family 'densee'; available: cross_encoder"):
        family_tasks("densee")
