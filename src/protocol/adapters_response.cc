// Parser events -> API responses and SSE sequences (S-REC-1).
#include "protocol/adapters.h"

namespace dsi::protocol {

Completion fold_events(const std::vector<Event>& events) {
    Completion c;
    for (const Event& e : events) {
        switch (e.kind) {
            case EventKind::kReasoningDelta: c.reasoning += e.text; break;
            case EventKind::kContentDelta: c.content += e.text; break;
            case EventKind::kToolCallStart:
                c.tool_calls.push_back(ToolCall{e.tool_id, e.tool_name, ""});
                break;
            case EventKind::kToolCallArgs:
                if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) < c.tool_calls.size()) {
                    c.tool_calls[static_cast<size_t>(e.tool_index)].arguments += e.text;
                }
                break;
            case EventKind::kToolCallEnd: break;
            case EventKind::kFinish:
                c.finish = e.finish;
                c.malformed = e.malformed;
                break;
        }
    }
    return c;
}

}  // namespace dsi::protocol
