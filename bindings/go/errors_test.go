package kalos

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// headerStatuses parses include/kalos.h: the members of the status enum, and the
// `#define KALOS_<NAME> <n>` constant of each.
func headerStatuses(t *testing.T) map[string]int {
	t.Helper()
	src, err := os.ReadFile("../../include/kalos.h")
	if err != nil {
		t.Fatal(err)
	}
	h := string(src)
	// The kalos_status_code enum lists every status: `KALOS_<NAME> = <n>,`.
	em := regexp.MustCompile(`(?s)enum kalos_status_code\b[^{]*\{(.*?)\};`).FindStringSubmatch(h)
	if em == nil {
		t.Fatal("enum kalos_status_code not found in kalos.h")
	}
	members := regexp.MustCompile(`(?m)^\s*KALOS_([A-Z][A-Z0-9_]*)\s*=\s*(\d+)\s*,`).FindAllStringSubmatch(em[1], -1)
	if len(members) < 2 {
		t.Fatalf("parsed %d enum members", len(members))
	}
	out := map[string]int{}
	for _, m := range members {
		v, _ := strconv.Atoi(m[2])
		out[m[1]] = v
	}
	return out
}

func TestEveryHeaderStatusHasADistinctSentinel(t *testing.T) {
	statuses := headerStatuses(t)
	if statuses["OK"] != 0 {
		t.Fatalf("KALOS_OK = %d", statuses["OK"])
	}
	seen := map[error]string{}
	for name, code := range statuses {
		s := Status(code)
		if got := s.String(); got != name {
			t.Errorf("Status(%d).String() = %q, header name %q", code, got, name)
		}
		if got := statusName(s); got != name {
			t.Errorf("kalos_status_str(%d) = %q, header name %q", code, got, name)
		}
		if name == "OK" {
			if s.Err() != nil {
				t.Errorf("StatusOK.Err() = %v", s.Err())
			}
			continue
		}
		sent := s.Err()
		if sent == nil {
			t.Errorf("KALOS_%s (%d) has no sentinel error", name, code)
			continue
		}
		if other, dup := seen[sent]; dup {
			t.Errorf("KALOS_%s and KALOS_%s share a sentinel", name, other)
		}
		seen[sent] = name
		var se interface{ Status() Status }
		if !errors.As(sent, &se) || se.Status() != s {
			t.Errorf("sentinel of KALOS_%s does not carry its status", name)
		}
		// An *Error of that status wraps exactly that sentinel, and carries code and message.
		err := error(newError("op", s, "library message"))
		if !errors.Is(err, sent) {
			t.Errorf("*Error{%s} does not match its sentinel", name)
		}
		for other, oname := range seen {
			if oname != name && errors.Is(err, other) {
				t.Errorf("*Error{%s} matches the sentinel of %s", name, oname)
			}
		}
		var ke *Error
		if !errors.As(err, &ke) || ke.Status != s || ke.Message != "library message" {
			t.Errorf("errors.As lost the status or message of %s", name)
		}
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "library message") {
			t.Errorf("message %q lacks the status name or the library message", err.Error())
		}
	}
	if len(seen) != len(sentinels)-1 {
		t.Errorf("the header has %d error statuses, the package %d sentinels", len(seen), len(sentinels)-1)
	}
	// kalos_status_str of an unknown code.
	if got := statusName(Status(len(statuses) + 100)); got != "UNKNOWN" {
		t.Errorf("kalos_status_str(unknown) = %q", got)
	}
}

func TestTimeoutUnderContextDeadlineMatchesDeadlineExceeded(t *testing.T) {
	err := callError("recall", StatusTimeout, "deadline passed", true)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v should match ErrTimeout and context.DeadlineExceeded", err)
	}
	err = callError("recall", StatusTimeout, "deadline passed", false)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("a timeout from the handle default should not match context.DeadlineExceeded")
	}
}

func TestVersion(t *testing.T) {
	v := Version()
	if !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(v) {
		t.Fatalf("Version() = %q", v)
	}
}
