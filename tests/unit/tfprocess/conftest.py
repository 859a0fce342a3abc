"""The feed's fixtures (a FeedServer maker, each transport), for the tests of this package."""

from tests.unit._feeds import make_server, transport  # noqa: F401 - fixtures
