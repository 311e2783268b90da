package events

import (
	"sync"
	"testing"
	"time"
)

// N4, L10: Publish never blocks; a full subscriber drops and the drop is
// counted, while a subscriber with room still gets every event.
func TestPublishDropsWhenFull(t *testing.T) {
	var b Bus
	slow, cancelSlow := b.Subscribe(1)
	defer cancelSlow()
	fast, cancelFast := b.Subscribe(8)
	defer cancelFast()

	at := time.Unix(1700000000, 0)
	for i, node := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		done := make(chan struct{})
		go func() {
			b.Publish(Event{Type: TypeConnected, Node: node, Time: at.Add(time.Duration(i) * time.Second)})
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("Publish of event %d blocked", i)
		}
	}
	if got, want := b.Dropped(), uint64(2); got != want {
		t.Fatalf("Dropped() = %d, want %d (slow subscriber holds 1 of 3)", got, want)
	}
	if e := <-slow; e.Node != "gpu-1" {
		t.Fatalf("slow subscriber got %q first, want gpu-1", e.Node)
	}
	for _, want := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		if e := <-fast; e.Node != want || e.Type != TypeConnected {
			t.Fatalf("fast subscriber got %+v, want node %s connected", e, want)
		}
	}
}

// N4: cancel unsubscribes and closes the channel; it is idempotent, and
// publishing afterwards neither panics nor counts a drop for it.
func TestCancelClosesAndUnsubscribes(t *testing.T) {
	var b Bus
	ch, cancel := b.Subscribe(0) // < 1 means 1
	b.Publish(Event{Type: TypeDisconnected, Node: "gpu-1", Reason: "heartbeat timeout"})
	cancel()
	cancel()
	b.Publish(Event{Type: TypeConnected, Node: "gpu-1"})
	if n := b.Subscribers(); n != 0 {
		t.Fatalf("Subscribers() = %d after cancel, want 0", n)
	}
	e, ok := <-ch
	if !ok || e.Reason != "heartbeat timeout" {
		t.Fatalf("buffered event = %+v, %v; want the disconnect with its reason", e, ok)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel still open after cancel")
	}
	if d := b.Dropped(); d != 0 {
		t.Fatalf("Dropped() = %d, want 0", d)
	}
}

// N4: concurrent Publish, Subscribe and cancel are race-free (run with -race)
// and every delivery is either received or counted as dropped.
func TestConcurrentPublishSubscribe(t *testing.T) {
	var b Bus
	const publishers, perPublisher, subs = 4, 200, 4
	var received sync.WaitGroup
	counts := make([]int, subs)
	cancels := make([]func(), subs)
	for i := range subs {
		ch, cancel := b.Subscribe(16)
		cancels[i] = cancel
		received.Add(1)
		go func() {
			defer received.Done()
			for range ch {
				counts[i]++
			}
		}()
	}
	var pub sync.WaitGroup
	for range publishers {
		pub.Add(1)
		go func() {
			defer pub.Done()
			for range perPublisher {
				b.Publish(Event{Type: TypeConnected, Node: "gpu-1"})
			}
		}()
	}
	pub.Wait()
	for _, c := range cancels {
		c()
	}
	received.Wait()
	total := uint64(0)
	for _, n := range counts {
		total += uint64(n)
	}
	if want := uint64(publishers * perPublisher * subs); total+b.Dropped() != want {
		t.Fatalf("received %d + dropped %d = %d, want %d", total, b.Dropped(), total+b.Dropped(), want)
	}
}
