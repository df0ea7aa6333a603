/*
 * chat_convs.h: render_expected.py's tools (tests/data/chat_templates), its
 * tool calls and the messages of its tool conversations, for the unit tests
 * that render them (test_chat.c, test_tools.c).
 */
#ifndef RESIDENT_TEST_CHAT_CONVS_H
#define RESIDENT_TEST_CHAT_CONVS_H

#include "chat.h"

/* render_expected.py's TOOLS as JSON text: get_weather's function (an OpenAI tool's "function", or a flat tool) and the tool now. */
#define TOOL_WEATHER_FN "{\"name\":\"get_weather\"," \
    "\"description\":\"The weather of a city, \\\"now\\\" or later.\",\"parameters\":{\"type\":\"object\"," \
    "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"The city, as Z\xc3\xbcrich\"}," \
    "\"days\":{\"type\":\"integer\",\"default\":1},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}," \
    "\"low\":{\"type\":\"number\",\"minimum\":-40.5},\"tags\":{\"type\":\"array\",\"items\":{\"type\":" \
    "\"string\"}}},\"required\":[\"city\"]}}"
#define TOOL_NOW "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"The time.\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}"

/* Its calls and results: the arguments as JSON text (render_expected.py's ARGS_TEXT). */
static struct chat_call calls2[] = {
	{ "call00001", "get_weather", "{\"city\":\"Z\xc3\xbcrich\",\"days\":2,\"low\":-0.5}" },
	{ "call00002", "now", "{}" },
};
#define SYS_M { "system", "You are a helpful assistant.", NULL, NULL, 0, NULL, NULL }
#define U_Q { "user", "Weather in Z\xc3\xbcrich for two days?", NULL, NULL, 0, NULL, NULL }
#define T_1 { "tool", "{\"temp\": 21}", NULL, NULL, 0, "call00001", "get_weather" }
#define T_2 { "tool", "12:00", NULL, NULL, 0, "call00002", "now" }
#define A_FIN { "assistant", "It is 21 degrees.", NULL, NULL, 0, NULL, NULL }
#define U_2 { "user", "Who are you?", NULL, NULL, 0, NULL, NULL }

#endif
