"""One real ``actorserve serve`` shared by the end-to-end HTTP tests, stopped (and checked) at the end."""
import openai
import pytest

from tests.e2e.server import API_KEY, Server


@pytest.fixture(scope="session")
def server():
    s = Server("--trust-request-chat-template")  # (the parity tests send templates; the hostile ones do not trust)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
