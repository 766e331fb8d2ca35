#pragma once
// What libidist.so and libidist-launch.so export. Both are built with hidden visibility
// (-fvisibility=hidden), so only declarations marked here reach the dynamic symbol table:
// the public API, and the small interface backend plugins are built against. Everything
// else, including the fmt, spdlog, Asio and Gloo code compiled into them, stays inside.

#define IDIST_API __attribute__((visibility("default")))
