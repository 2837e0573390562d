package etcd

import (
	"encoding/json"
	"testing"

	"github.com/tidaldb/tidal/harness/checker"
)

// What the lag sampler makes of a maintenance status answer as etcd 3.4
// sends it (uint64s as strings): the member's id, the leader it names,
// its term, raftIndex as its commit index and raftAppliedIndex as what it
// applied; an etcd without raftAppliedIndex falls back to raftIndex.
func TestLagSampleFromStatus(t *testing.T) {
	var st statusResponse
	body := `{"header":{"cluster_id":"1","member_id":"9372538179322589801","revision":"120","raft_term":"4"},
		"version":"3.4.23","leader":"10501334649042878790","raftIndex":"350","raftTerm":"4","raftAppliedIndex":"347"}`
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	got := lagSample(5e9, "n2", &st)
	want := checker.LagSample{Time: 5e9, Node: "n2", ID: 9372538179322589801, Leader: 10501334649042878790, Term: 4, Commit: 350, Applied: 347}
	if got.Time != want.Time || got.Node != want.Node || got.ID != want.ID || got.Leader != want.Leader ||
		got.Term != want.Term || got.Commit != want.Commit || got.Applied != want.Applied || len(got.Members) != 0 {
		t.Fatalf("sample %+v, want %+v", got, want)
	}
	st.RaftAppliedIndex = 0
	if got := lagSample(5e9, "n2", &st); got.Applied != 350 {
		t.Fatalf("without raftAppliedIndex: applied %d, want the commit index 350", got.Applied)
	}
}
