"""The run of segments (`ember.server.segments`) block-shaped APIs lay a reply
out in (Anthropic's content blocks, the Responses API's output items): a
segment opens when a chat event of another kind arrives, closing the one
before, and each call is a segment of its own, even right after another call."""

from ember.chat.events import CallArguments, CallEnd, CallStart, TextDelta, ThoughtDelta
from ember.server.segments import Segments


class Recorder(Segments):
    def start_thought(self):
        return ["start thought"]

    def thought(self, piece):
        return [f"thought {piece}"]

    def start_text(self):
        return ["start text"]

    def text(self, piece):
        return [f"text {piece}"]

    def start_call(self, call):
        return [f"start call {call.name}"]

    def arguments(self, fragment):
        return [f"args {fragment}"]

    def end(self, kind, *how):
        return [f"end {kind}" + (f" {how[0]}" if how else "")]


def test_segments_open_on_a_new_kind_and_each_call_is_its_own():
    s = Recorder()
    chat = [ThoughtDelta("a"), ThoughtDelta("b"), TextDelta("c"), CallStart(0, "call_0", "f"),
            CallArguments(0, "{"), CallArguments(0, "}"), CallEnd(0), CallStart(1, "call_1", "g"),
            CallArguments(1, "{}")]
    events = s.feed(chat[:4]) + s.feed(chat[4:]) + s.close("incomplete")
    assert events == ["start thought", "thought a", "thought b", "end thought", "start text", "text c", "end text",
                      "start call f", "args {", "args }", "end call", "start call g", "args {}", "end call incomplete"]
    assert s.close() == [] and s.open is None
