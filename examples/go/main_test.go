package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	kalos "github.com/kalos-dev/kalos/bindings/go"
)

func TestService(t *testing.T) {
	// Role auto: no server runs under this name, so the test process becomes it.
	name := fmt.Sprintf("goexample-%d", os.Getpid())
	m, err := newMemories(name, kalos.Options{Dim: 64}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ts := httptest.NewServer(m.routes())
	defer ts.Close()

	post := func(path, body string) *http.Response {
		t.Helper()
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, mem := range []struct{ user, text string }{
		{"alice", "alice drinks green tea every morning"},
		{"alice", "alice has a dog named rex"},
		{"bob", "bob drinks black coffee"},
		{"bob", "bob lives in lisbon"},
	} {
		resp := post("/users/"+mem.user+"/memories", fmt.Sprintf(`{"id":%d,"text":%q}`, i+1, mem.text))
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("remember: %s", resp.Status)
		}
		resp.Body.Close()
	}
	recall := func(user, text string) []hitOut {
		t.Helper()
		resp := post("/users/"+user+"/recall", fmt.Sprintf(`{"text":%q,"k":5}`, text))
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("recall: %s", resp.Status)
		}
		var hits []hitOut
		if err := json.NewDecoder(resp.Body).Decode(&hits); err != nil {
			t.Fatal(err)
		}
		return hits
	}
	hits := recall("alice", "which drinks does alice like")
	if len(hits) != 2 || !strings.Contains(hits[0].Text, "tea") {
		t.Fatalf("alice: %+v", hits)
	}
	hits = recall("bob", "which drinks does bob like")
	if len(hits) != 2 || !strings.Contains(hits[0].Text, "coffee") {
		t.Fatalf("bob: %+v", hits)
	}
	// A wrong embedding dimension is the client's fault: 400.
	resp := post("/users/bob/recall", `{"embedding":[1,2,3]}`)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad dim: %s", resp.Status)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodDelete, ts.URL+"/users/alice", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("forget: %v %v", resp, err)
	}
	resp.Body.Close()
	if hits := recall("alice", "tea"); len(hits) != 0 {
		t.Fatalf("after forget: %+v", hits)
	}
	resp, err = http.Get(ts.URL + "/stats")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stats: %v %v", resp, err)
	}
	resp.Body.Close()
}
