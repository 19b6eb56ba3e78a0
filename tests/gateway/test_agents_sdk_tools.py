"""The OpenAI Agents SDK (unmodified) through the gateway with a function tool: with `tool_choice="required"`
the untrained tiny model calls the tool, the SDK runs it, and a streamed run (`Runner.run_streamed`, which
reads the Responses API's events) does the same, recording the same sampled ids as the unstreamed run."""

import asyncio

import openai
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled


set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers


def test_an_agents_sdk_function_tool_runs_streamed_and_not(served):
    gateway, base = served
    ran = []

    @function_tool
    def clock() -> str:
        """The time now."""
        ran.append("clock")
        return "12:00"

    def agent(episode: str) -> Agent:
        client = openai.AsyncOpenAI(base_url=f"{base}/episodes/{episode}/v1", api_key="unused", max_retries=0)
        return Agent(
            name="timekeeper",
            instructions="Tell the time.",
            model=OpenAIResponsesModel(model="tiny", openai_client=client),
            tools=[clock],
            model_settings=ModelSettings(tool_choice="required", max_tokens=40, temperature=0),
            tool_use_behavior="stop_on_first_tool",  # the tool's output is the answer: one model call
        )

    async def both():
        plain = await Runner.run(agent("sdk-plain"), "What time is it?")
        streamed = Runner.run_streamed(agent("sdk-streamed"), "What time is it?")
        kinds = [
            event.data.type async for event in streamed.stream_events() if event.type == "raw_response_event"
        ]
        return plain, streamed, kinds

    plain, streamed, kinds = asyncio.run(both())
    assert plain.final_output == streamed.final_output == "12:00" and ran == ["clock", "clock"]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    [first], [again] = gateway.episodes["sdk-plain"].calls, gateway.episodes["sdk-streamed"].calls
    assert (
        first.completion_ids == again.completion_ids
        and first.returned["tool_calls"][0]["function"]["name"] == "clock"
    )
