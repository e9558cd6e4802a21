"""A fixture teardown that raises asyncio.CancelledError fails its own test, not every later one.

pytest tears a test's fixtures down one after another and goes on past an Exception, but not past a
BaseException that is neither KeyboardInterrupt nor SystemExit: the fixtures still to be torn down are then never
finalised, and since a function-scoped fixture's cached value is reused while it is set, every later test in
that process gets them as they were (the other test's tmp_path, its database) and fails or errors. Here such an
exception from a fixture's teardown is raised again as a RuntimeError naming the fixture, the original chained,
so pytest reports it on the test it belongs to and finalises the rest.
"""

from _pytest.fixtures import FixtureDef, SubRequest

_finish = FixtureDef.finish


def _finish_or_fail(self: FixtureDef[object], request: SubRequest) -> None:
    try:
        _finish(self, request)
    except (Exception, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # CancelledError, GeneratorExit, a BaseExceptionGroup of them
        raise RuntimeError(f"the teardown of fixture {self.argname!r} raised {error!r}") from error


FixtureDef.finish = _finish_or_fail  # type: ignore[method-assign]
