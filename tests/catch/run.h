#pragma once
// Catch2's session, compiled once (tests/catch/session.cpp) for every test program: a Catch2 v2
// runner is the slowest file of a test program to compile, and each program's main() calls this
// instead of including it.
namespace ptrain::test {
int run_catch(int argc, char** argv);
}  // namespace ptrain::test
