"""One real ``actorserve serve`` shared by the end-to-end HTTP tests, stopped (and checked) at the end."""
import openai
import pytest

from tests.e2e.server import API_KEY, Server


@pytest.fixture(scope="session")
def server():
    # (the parity tests send templates, the hostile ones do not trust them; a grammar's compile gets 5 s)
    s = Server("--trust-request-chat-template", "--grammar-compile-seconds", "5")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="session")
def agent_server():
    """A server for agents: auto tool choice with the hermes parser, qwen3's reasoning parser (SmolLM2 never
    opens a thinking block itself: its answers stay content), a small Responses store."""
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
               "--responses-store-entries", "8")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def agent_client(agent_server):
    return openai.OpenAI(base_url=agent_server.base_url + "/v1", api_key=API_KEY, max_retries=0)
