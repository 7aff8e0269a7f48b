"""A local OpenAI-compatible server (stdlib) on 127.0.0.1 for the agent tests.

GET  /v1/models            the model list; the first `unlisted_gets` answers leave the model out
                           (a gateway still loading it)
POST /v1/chat/completions  route(request_json) -> {"content": str, "tool_calls": [(name, args), ...]};
                           `fail_first=k` answers the first k requests with HTTP 500
POST /v1/responses         the Responses API (non-streaming), same route; its turn may also hold
                           "web_search": query, answered as a completed web_search_call output item
                           ahead of the message and the function calls
Every request is recorded (method, path, Authorization header, body).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class StubOpenAI:
    def __init__(self, route: Callable[[dict], dict], model: str = "stub-model", fail_first: int = 0,
                 unlisted_gets: int = 0):
        self.route, self.model, self.fail_first = route, model, fail_first
        self.requests: list[dict] = []
        self.chat_answers = 0  # successful chat completions
        self._lock = threading.Lock()
        self._n = 0
        self.unlisted_gets = unlisted_gets
        self._gets = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                stub._record(self, None)
                if self.path.rstrip("/").endswith("/models"):
                    with stub._lock:
                        stub._gets += 1
                        ids = [stub.model] if stub._gets > stub.unlisted_gets else []
                    return self._send(200, {"object": "list", "data": [
                        {"id": "other-model", "object": "model", "created": 0, "owned_by": "stub"}] + [
                        {"id": i, "object": "model", "created": 0, "owned_by": "stub"} for i in ids]})
                self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                stub._record(self, body)
                responses = self.path.endswith("/responses")
                if not (responses or self.path.endswith("/chat/completions")):
                    return self._send(404, {"error": {"message": f"{self.path} not supported"}})
                if responses and body.get("stream"):
                    return self._send(400, {"error": {"message": "the stub answers /responses without streaming"}})
                with stub._lock:
                    stub._n += 1
                    fail = stub._n <= stub.fail_first
                if fail:
                    return self._send(500, {"error": {"message": "stub transient 500", "type": "server_error"}})
                turn = stub.route(body)
                with stub._lock:
                    stub.chat_answers += 1
                if responses:
                    return self._send(200, stub._response(body, turn))
                if body.get("stream"):
                    return self._stream(body, turn)
                self._send(200, stub._completion(body, turn))

            def _stream(self, body, turn):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                cid, created = f"chatcmpl-{time.time_ns()}", int(time.time())

                def ev(delta, finish=None, usage=None, choices=True):
                    chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": stub.model,
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
                    if usage is not None:
                        chunk["usage"] = usage
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())

                ev({"role": "assistant", "content": turn.get("content") or ""})
                for i, (name, args) in enumerate(turn.get("tool_calls", [])):
                    ev({"tool_calls": [{"index": i, "id": f"call_{cid[-8:]}_{i}", "type": "function",
                                        "function": {"name": name, "arguments": json.dumps(args)}}]})
                ev({}, finish="tool_calls" if turn.get("tool_calls") else "stop")
                if (body.get("stream_options") or {}).get("include_usage"):
                    ev(None, usage=stub._usage(body), choices=False)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _record(self, h, body):
        with self._lock:
            self.requests.append({"method": h.command, "path": h.path, "auth": h.headers.get("Authorization"),
                                  "body": body})

    @staticmethod
    def _usage(body):
        p = sum(len(json.dumps(m)) for m in body.get("messages", [])) // 4
        return {"prompt_tokens": p, "completion_tokens": 7, "total_tokens": p + 7}

    def _completion(self, body, turn):
        tcs = [{"id": f"call_{time.time_ns()}_{i}", "type": "function",
                "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(turn.get("tool_calls", []))]
        msg = {"role": "assistant", "content": turn.get("content") or ("" if tcs else "ok")}
        if tcs:
            msg["tool_calls"] = tcs
        return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "choices": [{"index": 0, "message": msg,
                                                  "finish_reason": "tool_calls" if tcs else "stop"}],
                "usage": self._usage(body)}

    def _response(self, body, turn):
        """A Responses API object: [web_search_call], [message], function_call..."""
        rid, out = f"resp_{time.time_ns()}", []
        if turn.get("web_search"):
            out.append({"type": "web_search_call", "id": f"ws_{rid[5:]}", "status": "completed",
                        "action": {"type": "search", "query": turn["web_search"]}})
        if turn.get("content") or not turn.get("tool_calls"):
            out.append({"type": "message", "id": f"msg_{rid[5:]}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": turn.get("content") or "ok", "annotations": []}]})
        for i, (name, args) in enumerate(turn.get("tool_calls", [])):
            out.append({"type": "function_call", "id": f"fc_{rid[5:]}_{i}", "call_id": f"call_{rid[5:]}_{i}",
                        "name": name, "arguments": json.dumps(args), "status": "completed"})
        p = len(json.dumps(body.get("input", []))) // 4
        return {"id": rid, "object": "response", "created_at": int(time.time()), "model": self.model,
                "status": "completed", "error": None, "incomplete_details": None, "instructions": None,
                "metadata": {}, "output": out, "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
                "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
                "usage": {"input_tokens": p, "output_tokens": 7, "total_tokens": p + 7,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
