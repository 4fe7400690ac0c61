package reconcile

import "testing"

func TestIDAlloc(t *testing.T) {
	a := newIDAlloc[string](4) // IDs 1..3
	id1, fresh, _ := a.get("a")
	if !fresh || id1 != 1 {
		t.Fatalf("first id %d fresh %v", id1, fresh)
	}
	if again, fresh, _ := a.get("a"); again != id1 || fresh {
		t.Fatal("an ID must stay with its key")
	}
	a.get("b")
	a.get("c")
	if _, _, err := a.get("d"); err == nil {
		t.Fatal("exhaustion must be an error")
	}
	a.release("b")
	if id, fresh, err := a.get("d"); err != nil || !fresh || id != 2 {
		t.Fatalf("released ID not reused: %d %v %v", id, fresh, err)
	}
	r := newIDAlloc[string](100)
	r.restore("x", 42)
	if id, fresh, _ := r.get("x"); id != 42 || fresh {
		t.Fatal("restored ID not kept")
	}
	if id, _, _ := r.get("y"); id != 43 {
		t.Fatalf("allocation after restore gave %d, want 43", id)
	}
}
