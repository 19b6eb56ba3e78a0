"""The gateway's HTTP application: FastAPI routes for the OpenAI API at /v1 and, per episode, at
/episodes/<id>/v1, with the episode record's read-out and release; grl/gateway/server.py answers them."""

from grl.gateway.requests import BadRequest
from grl.gateway.server import Gateway

MAX_WAITING_CALLS = 256  # calls answered at once (each waits on a thread for its generation)


def build_app(gateway: Gateway):
    """The FastAPI application serving `gateway` at /v1 and, per episode, at /episodes/<id>/v1."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    from grl.gateway.bodies import read_body
    from grl.gateway.responses import chat_body, response_of
    from grl.gateway.scoring import add_scoring_routes
    from grl.gateway.streaming import chunks, response_events

    app = FastAPI(title="GRL gateway")
    threads = []  # the limiter of the threads that wait for the engine, made in the event loop on first use

    def refused(err: BadRequest) -> JSONResponse:
        status = getattr(err, "status", 400)
        return JSONResponse(
            {"error": {"message": str(err), "type": "invalid_request_error"}}, status_code=status
        )

    def models() -> dict:
        return gateway.models()

    @app.get("/episodes/{episode}")
    def read_episode(episode: str):
        try:
            return gateway.readout(episode)
        except BadRequest as err:
            return refused(err)

    @app.delete("/episodes/{episode}")
    def close_episode(episode: str):
        try:
            return gateway.readout(episode, close=True)
        except BadRequest as err:
            return refused(err)

    async def off_loop(call, *args):  # on a thread, off the event loop: generation blocks for seconds
        import anyio

        if not threads:  # anyio's default of 40 would cap how many programs' calls share an engine batch
            threads.append(anyio.CapacityLimiter(MAX_WAITING_CALLS))
        return await anyio.to_thread.run_sync(call, *args, limiter=threads[0])

    async def completions(request: Request):
        try:
            body = await read_body(request)
            response = await off_loop(gateway.complete, body, request.path_params.get("episode"))
        except BadRequest as err:
            return refused(err)
        if body.get("stream"):
            return StreamingResponse(chunks(response, gateway.pieces), media_type="text/event-stream")
        return response

    async def responses(request: Request):
        try:
            body = await read_body(request)
            answered = await off_loop(gateway.complete, chat_body(body), request.path_params.get("episode"))
            response = response_of(answered, body)
        except BadRequest as err:
            return refused(err)
        if body.get("stream"):
            return StreamingResponse(
                response_events(response, gateway.pieces), media_type="text/event-stream"
            )
        return response

    # Each API at /v1 and, for one episode, at /episodes/<id>/v1 (the path names the episode).
    for root in ("", "/episodes/{episode}"):
        app.add_api_route(f"{root}/v1/models", models, methods=["GET"])
        app.add_api_route(f"{root}/v1/chat/completions", completions, methods=["POST"])
        app.add_api_route(f"{root}/v1/responses", responses, methods=["POST"])
    add_scoring_routes(app, gateway, refused, off_loop)  # /v1/completions and /tokenize: not an episode's
    return app
