"""The tally every interop script keeps: calling it with a check's name and outcome prints one
`ok` or `FAIL` line; `summary` prints the failures again (CI keeps only the head and tail of a
long output) and the counts, and gives the script's exit status."""


class Checks:
    def __init__(self):
        self.passed = 0
        self.failures = []

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failures.append(f"FAIL {name} {detail}")
            print(self.failures[-1])

    @property
    def failed(self):
        return len(self.failures)

    def summary(self, title):
        for line in self.failures:
            print(line)
        print(f"{title}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
