/*
 * Expectation helpers shared by the C tests (tests/c/test_*.c): each failed expectation is
 * counted and printed with its line and the last error message; main() exits non-zero when
 * `failures` is not 0.
 */
#ifndef RIFTCO_TESTS_CHECK_H
#define RIFTCO_TESTS_CHECK_H

#include "riftco.h"

#include <stdio.h>
#include <string.h>

static int checks = 0;
static int failures = 0;

static const char *last_error(void) {
    static char message[1024];
    size_t needed = 0;
    if (rt_last_error_message(message, sizeof message, &needed) != RT_OK) {
        return "<rt_last_error_message failed>";
    }
    return message;
}

static void expect_status(const char *what, rt_status got, rt_status want, int line) {
    checks++;
    if (got != want) {
        failures++;
        fprintf(stderr, "line %d: %s returned %s, expected %s (last error: %s)\n", line, what,
                rt_status_name(got), rt_status_name(want), last_error());
    }
}

static void expect_true(const char *what, int cond, int line) {
    checks++;
    if (!cond) {
        failures++;
        fprintf(stderr, "line %d: expected %s\n", line, what);
    }
}

#define EXPECT(call, status) expect_status(#call, (call), (status), __LINE__)
#define EXPECT_OK(call) expect_status(#call, (call), RT_OK, __LINE__)
#define EXPECT_TRUE(cond) expect_true(#cond, (cond) ? 1 : 0, __LINE__)
#define EXPECT_MESSAGE_HAS(text) \
    expect_true("last error contains \"" text "\"", strstr(last_error(), (text)) != NULL, __LINE__)

#endif /* RIFTCO_TESTS_CHECK_H */
