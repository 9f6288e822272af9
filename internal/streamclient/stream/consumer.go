package stream

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/streamclient/amqp"
	logs "github.com/idemkit/idem/internal/streamclient/logs"
)

type Consumer struct {
	client *Client
	// Deprecated: ConsumerID is deprecated. Use GetID() instead.
	ID               uint8 // also the SubscriptionId
	response         *Response
	options          *ConsumerOptions
	onClose          func()
	mutex            *sync.RWMutex
	chunkForConsumer chan chunkInfo
	// closeCh is closed when the consumer is shutting down.
	closeCh chan struct{}
	// closeOnce ensures close() is idempotent even if called concurrently.
	closeOnce       sync.Once
	MessagesHandler MessagesHandler
	// different form ConsumerOptions.offset. ConsumerOptions.offset is just the configuration
	// and won't change. currentOffset is the status of the offset
	currentOffset int64

	// Remembers the last stored offset (manual or automatic) to avoid to store always the same values
	lastStoredOffset int64

	closeHandler chan Event
	// see autocommit strategy
	// it is needed to trigger the
	// auto-commit after messageCountBeforeStorage
	messageCountBeforeStorage int

	status int

	// Single Active consumer. The consumer can be running
	// but not active. This flag is used to know if the consumer
	// is in waiting mode or not.
	// in normal mode, the consumer is always isPromotedAsActive==true
	isPromotedAsActive bool

	// lastAutoCommitStored tracks when the offset was last flushed
	lastAutoCommitStored time.Time
}

func (consumer *Consumer) setStatus(status int) {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	consumer.status = status
}

func (consumer *Consumer) getStatus() int {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.status
}

func (consumer *Consumer) isZombie() bool {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.status == open && !consumer.client.socket.isOpen()
}

func (consumer *Consumer) GetStreamName() string {
	if consumer.options == nil {
		return ""
	}
	return consumer.options.streamName
}

func (consumer *Consumer) GetName() string {
	if consumer.options == nil {
		return ""
	}
	return consumer.options.ConsumerName
}

func (consumer *Consumer) setCurrentOffset(offset int64) {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	consumer.currentOffset = offset
}

func (consumer *Consumer) GetOffset() int64 {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.currentOffset
}

func (consumer *Consumer) GetID() uint8 {
	consumer.mutex.RLock()
	defer consumer.mutex.RUnlock()
	return consumer.ID
}

func (consumer *Consumer) setID(id uint8) {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	consumer.ID = id
}

// isActive returns true if the consumer is promoted as active
// used for Single Active Consumer. Always true in other cases
func (consumer *Consumer) isActive() bool {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.isPromotedAsActive
}

func (consumer *Consumer) setPromotedAsActive(promoted bool) {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	consumer.isPromotedAsActive = promoted
}

// Deprecated: The method name may be misleading.
// The method does not indicate the last message stored, but the last stored in memory.
// The method was added to avoid to query the offset from the server, but it created confusion.
// Use `QueryOffset` instead.:
//
//	     	offset, err := consumer.QueryOffset()
//		// or:
//			offset, err := env.QueryOffset(consumerName, streamName)
//		 // check the error
//		 ....
//		 SetOffset(stream.OffsetSpecification{}.Offset(offset)).
//
// There is an edge case in which multiple clients use the same consumer name,
// and the last stored offset in memory is not the one the user expects.
// So, to avoid confusion, it is better to use QueryOffset, which always gets the value from the server.

func (consumer *Consumer) GetLastStoredOffset() int64 {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.lastStoredOffset
}

func (consumer *Consumer) updateLastStoredOffset() bool {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	if consumer.lastStoredOffset < consumer.currentOffset {
		consumer.lastStoredOffset = consumer.currentOffset
		return true
	}
	return false
}

func (consumer *Consumer) GetCloseHandler() chan Event {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.closeHandler
}

func (consumer *Consumer) NotifyClose() ChannelClose {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	ch := make(chan Event, 1)
	consumer.closeHandler = ch
	return ch
}

func (consumer *Consumer) Credit(credits int16) error {
	if consumer.options.CreditStrategy != ManualCreditStrategy {
		return fmt.Errorf("credit can only be called when CreditStrategy is ManualCreditStrategy")
	}
	if credits <= 0 {
		return fmt.Errorf("credits must be a positive number")
	}
	consumer.client.credit(consumer.ID, credits)
	return nil
}

type ConsumerContext struct {
	Consumer  *Consumer
	chunkInfo *chunkInfo
}

func (cc ConsumerContext) GetEntriesCount() uint16 {
	return cc.chunkInfo.numEntries
}

// MessagesHandler is the function that will be called when a message is received. This function
// is used to process incoming messages. The consumer context allows access to the consumer handling
// the message and some chunk information.
//
// When manual credit strategy is used, the consumer context allows to send credits to the broker.
type MessagesHandler func(consumerContext ConsumerContext, message *amqp.Message)

type AutoCommitStrategy struct {
	messageCountBeforeStorage int
	flushInterval             time.Duration
}

func (ac *AutoCommitStrategy) SetCountBeforeStorage(messageCountBeforeStorage int) *AutoCommitStrategy {
	ac.messageCountBeforeStorage = messageCountBeforeStorage
	return ac
}
func (ac *AutoCommitStrategy) SetFlushInterval(flushInterval time.Duration) *AutoCommitStrategy {
	ac.flushInterval = flushInterval
	return ac
}

func NewAutoCommitStrategy() *AutoCommitStrategy {
	return &AutoCommitStrategy{
		messageCountBeforeStorage: 10_000,
		flushInterval:             5 * time.Second,
	}
}

type PostFilter func(message *amqp.Message) bool

type ConsumerFilter struct {
	Values          []string
	MatchUnfiltered bool
	PostFilter      PostFilter
}

func NewConsumerFilter(values []string, matchUnfiltered bool, postFilter PostFilter) *ConsumerFilter {
	return &ConsumerFilter{
		Values:          values,
		MatchUnfiltered: matchUnfiltered,
		PostFilter:      postFilter,
	}
}

type ConsumerUpdate func(streamName string, isActive bool) OffsetSpecification

type SingleActiveConsumer struct {
	Enabled bool
	// ConsumerUpdate is the function that will be called when the consumer is promoted
	// that is when the consumer is active. The function will receive a boolean that is true
	// the user can decide to return a new offset to start from.
	ConsumerUpdate ConsumerUpdate
	// This offset is the one form the user that decides from the ConsumerUpdate function
	// nothing to do with: ConsumerOptions.Offset
	// the ConsumerOptions.Offset is the initial offset and in case of SingleActiveConsumer
	// is not used because the consumer will be promoted and the offset will be set by the ConsumerUpdate
	// This is needed to filter the messages during the promotion where needed
	offsetSpecification OffsetSpecification

	// SingleActiveConsumer can be used with the super stream consumer
	// in this case we need to pass the super stream name
	superStream string
}

func NewSingleActiveConsumer(consumerUpdate ConsumerUpdate) *SingleActiveConsumer {
	return &SingleActiveConsumer{
		Enabled:        true,
		ConsumerUpdate: consumerUpdate,
	}
}

func newSingleActiveConsumerWithAllParameters(
	consumerUpdate ConsumerUpdate, isEnabled bool, superStream string) *SingleActiveConsumer {
	return &SingleActiveConsumer{
		Enabled:        isEnabled,
		ConsumerUpdate: consumerUpdate,
		superStream:    superStream,
	}
}

func (s *SingleActiveConsumer) SetEnabled(enabled bool) *SingleActiveConsumer {
	s.Enabled = enabled
	return s
}

type CreditStrategy int

const (
	AutomaticCreditStrategy CreditStrategy = iota // Default, sends 1 credit per chunk
	ManualCreditStrategy                          // User manages credits
)

// ConsumerOptions for a consumer
type ConsumerOptions struct {
	ConsumerName         string
	streamName           string
	autocommit           bool
	autoCommitStrategy   *AutoCommitStrategy
	Offset               OffsetSpecification
	CRCCheck             bool
	initialCredits       int16
	ClientProvidedName   string
	Filter               *ConsumerFilter
	SingleActiveConsumer *SingleActiveConsumer
	CreditStrategy       CreditStrategy
}

// NewConsumerOptions returns a new ConsumerOptions instance
func NewConsumerOptions() *ConsumerOptions {
	return &ConsumerOptions{
		Offset:             OffsetSpecification{}.Last(),
		autocommit:         false,
		autoCommitStrategy: NewAutoCommitStrategy(),
		CRCCheck:           true,
		CreditStrategy:     AutomaticCreditStrategy,
		initialCredits:     10,
		ClientProvidedName: "go-stream-consumer",
		Filter:             nil,
	}
}

func (c *ConsumerOptions) SetConsumerName(consumerName string) *ConsumerOptions {
	c.ConsumerName = consumerName
	return c
}

func (c *ConsumerOptions) SetCRCCheck(crcCheck bool) *ConsumerOptions {
	c.CRCCheck = crcCheck
	return c
}

func (c *ConsumerOptions) SetInitialCredits(initialCredits int16) *ConsumerOptions {
	c.initialCredits = initialCredits
	return c
}

func (c *ConsumerOptions) SetAutoCommit(autoCommitStrategy *AutoCommitStrategy) *ConsumerOptions {
	c.autocommit = true
	if autoCommitStrategy == nil {
		c.autoCommitStrategy = NewAutoCommitStrategy()
	} else {
		c.autoCommitStrategy = autoCommitStrategy
	}
	return c
}

func (c *ConsumerOptions) SetManualCommit() *ConsumerOptions {
	c.autocommit = false
	return c
}
func (c *ConsumerOptions) SetOffset(offset OffsetSpecification) *ConsumerOptions {
	c.Offset = offset
	return c
}

func (c *ConsumerOptions) SetClientProvidedName(clientProvidedName string) *ConsumerOptions {
	c.ClientProvidedName = clientProvidedName
	return c
}

func (c *ConsumerOptions) GetClientProvidedName(defaultClientProvidedName string) string {
	if c == nil {
		return defaultClientProvidedName
	}
	return c.ClientProvidedName
}

func (c *ConsumerOptions) SetFilter(filter *ConsumerFilter) *ConsumerOptions {
	c.Filter = filter
	return c
}

func (c *ConsumerOptions) SetSingleActiveConsumer(singleActiveConsumer *SingleActiveConsumer) *ConsumerOptions {
	c.SingleActiveConsumer = singleActiveConsumer
	return c
}

// SetCreditStrategy sets the credit strategy for the consumer. Available strategies are:
//   - AutomaticCreditStrategy: 1 credit per chunk.
//   - ManualCreditStrategy: the number of credits specified in the initialCredits field.
//
// The credit is a flow control mechanism that allows consumers to control how RabbitMQ sends messages to them.
//
// The AutomaticCreditStrategy delegates the credit management to the library. The library will send 1 credit after receiving a chunk.
//
// The ManualCreditStrategy lets the user send credits to the broker. When ManualCreditStrategy is used, it is critically important
// to send credits to keep receiving messages. The consumer context in the message handler can be used to send credits.
func (c *ConsumerOptions) SetCreditStrategy(creditStrategy CreditStrategy) *ConsumerOptions {
	c.CreditStrategy = creditStrategy
	return c
}

func (c *ConsumerOptions) IsSingleActiveConsumerEnabled() bool {
	return c.SingleActiveConsumer != nil && c.SingleActiveConsumer.Enabled
}

func (c *ConsumerOptions) IsFilterEnabled() bool {
	return c.Filter != nil
}

func (c *Client) credit(subscriptionId byte, credit int16) {
	length := 2 + 2 + 1 + 2
	var b = bytes.NewBuffer(make([]byte, 0, length+4))
	writeProtocolHeader(b, length, commandCredit)
	writeByte(b, subscriptionId)
	writeShort(b, credit)
	err := c.socket.writeAndFlush(b.Bytes())
	if err != nil {
		logs.LogWarn("credit error:%s", err)
	}
}

func (consumer *Consumer) Close() error {
	if consumer.getStatus() == closed {
		return AlreadyClosed
	}

	consumer.close(Event{
		Command:    CommandUnsubscribe,
		StreamName: consumer.GetStreamName(),
		Name:       consumer.GetName(),
		Reason:     UnSubscribe,
		Err:        nil,
	})

	return nil
}

// sendChunk delivers a chunk to the dispatch goroutine. It returns false
// (dropping the chunk) if the consumer is concurrently closing, avoiding a
// panic from sending on a closed channel.
func (consumer *Consumer) sendChunk(chunk chunkInfo) bool {
	select {
	case <-consumer.closeCh:
		return false
	default:
	}
	select {
	case consumer.chunkForConsumer <- chunk:
		return true
	case <-consumer.closeCh:
		return false
	}
}

func (consumer *Consumer) close(reason Event) {
	consumer.closeOnce.Do(func() {
		consumer.cacheStoreOffset()
		consumer.setStatus(closed)
		// Signal closeCh first so that any concurrent sendChunk call and the
		// dispatch goroutine in client.go both unblock cleanly.
		close(consumer.closeCh)

		// Drain any chunks that were buffered before closeCh was signalled.
		// sendChunk can no longer enqueue new items at this point
		for len(consumer.chunkForConsumer) > 0 {
			<-consumer.chunkForConsumer
		}

		if closeHandler := consumer.GetCloseHandler(); closeHandler != nil {
			closeHandler <- reason
			close(consumer.closeHandler)
			consumer.closeHandler = nil
		}

		if consumer.response.data != nil {
			close(consumer.response.data)
			consumer.response.data = nil
		}

		if reason.Reason == UnSubscribe {
			length := 2 + 2 + 4 + 1
			resp := consumer.client.coordinator.NewResponse(CommandUnsubscribe)
			correlationId := resp.correlationid
			var b = bytes.NewBuffer(make([]byte, 0, length+4))
			writeProtocolHeader(b, length, CommandUnsubscribe,
				correlationId)

			writeByte(b, consumer.ID)
			err := consumer.client.handleWrite(b.Bytes(), resp)
			if err.Err != nil && err.isTimeout {
				logs.LogWarn("error during consumer unsubscribe:%s", err.Err)
			}
		}

		// it could be nil only during tests
		if consumer.client != nil {
			_, _ = consumer.client.coordinator.ExtractConsumerById(consumer.ID)

			if consumer.options != nil && consumer.client.coordinator.ConsumersCount() == 0 {
				consumer.client.Close()
			}
		}

		if consumer.onClose != nil {
			consumer.onClose()
		}
	})
}

func (consumer *Consumer) cacheStoreOffset() {
	if consumer.options.autocommit {
		consumer.mutex.Lock()
		consumer.lastAutoCommitStored = time.Now()
		consumer.messageCountBeforeStorage = 0
		consumer.mutex.Unlock() // updateLastStoredOffset() in internalStoreOffset() also locks mutexMessageMap, so not using defer for unlock

		err := consumer.internalStoreOffset()
		if err != nil {
			logs.LogError("cache Store Offset error : %s", err)
		}
	}
}

func (consumer *Consumer) increaseMessageCountBeforeStorage() int {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	consumer.messageCountBeforeStorage += 1
	return consumer.messageCountBeforeStorage
}

func (consumer *Consumer) getLastAutoCommitStored() time.Time {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()
	return consumer.lastAutoCommitStored
}

// StoreOffset stores the current offset for this consumer given its name and stream
func (consumer *Consumer) StoreOffset() error {
	return consumer.internalStoreOffset()
}

// StoreCustomOffset stores a custom offset for this consumer given its name and stream
func (consumer *Consumer) StoreCustomOffset(offset int64) error {
	consumer.mutex.Lock()
	defer consumer.mutex.Unlock()

	if consumer.lastStoredOffset < offset {
		consumer.lastStoredOffset = offset
		return consumer.writeOffsetToSocket(offset)
	}
	return nil
}
func (consumer *Consumer) internalStoreOffset() error {
	if consumer.options.streamName == "" {
		return fmt.Errorf("stream Name can't be empty")
	}

	if consumer.updateLastStoredOffset() {
		return consumer.writeOffsetToSocket(consumer.GetOffset())
	}
	return nil
}
func (consumer *Consumer) writeOffsetToSocket(offset int64) error {
	length := 2 + 2 + 2 + len(consumer.options.ConsumerName) + 2 +
		len(consumer.options.streamName) + 8
	var b = bytes.NewBuffer(make([]byte, 0, length+4))
	writeProtocolHeader(b, length, commandStoreOffset)

	writeString(b, consumer.options.ConsumerName)
	writeString(b, consumer.options.streamName)

	writeLong(b, offset)
	return consumer.client.socket.writeAndFlush(b.Bytes())
}

func (consumer *Consumer) writeConsumeUpdateOffsetToSocket(correlationID uint32, offsetSpec OffsetSpecification) error {
	length := 2 + 2 + 4 + 2 + 2
	if offsetSpec.isOffset() ||
		offsetSpec.isTimestamp() {
		length += 8
	}

	var b = bytes.NewBuffer(make([]byte, 0, length+4))
	writeProtocolHeader(b, length, commandConsumerUpdate)

	writeUInt(b, correlationID)
	writeUShort(b, responseCodeOk)

	writeShort(b, offsetSpec.typeOfs)

	if offsetSpec.isOffset() ||
		offsetSpec.isTimestamp() {
		writeLong(b, offsetSpec.offset)
	}
	return consumer.client.socket.writeAndFlush(b.Bytes())
}

// QueryOffset returns the last stored offset for this consumer given its name and stream
func (consumer *Consumer) QueryOffset() (int64, error) {
	if (consumer.options == nil) || (consumer.client == nil) || (consumer.options.ConsumerName == "") || (consumer.options.streamName == "") {
		return -1, fmt.Errorf("offset query error: consumer not properly initialized")
	}
	return consumer.client.queryOffset(consumer.options.ConsumerName, consumer.options.streamName)
}

/*
SetOffset constants
*/
const (
	typeFirst     = int16(1)
	typeLast      = int16(2)
	typeNext      = int16(3)
	typeOffset    = int16(4)
	typeTimestamp = int16(5)
	// Deprecated: see LastConsumed()
	typeLastConsumed = int16(6)
)

type OffsetSpecification struct {
	typeOfs int16
	offset  int64
}

func (o OffsetSpecification) First() OffsetSpecification {
	o.typeOfs = typeFirst
	return o
}

func (o OffsetSpecification) Last() OffsetSpecification {
	o.typeOfs = typeLast
	return o
}

func (o OffsetSpecification) Next() OffsetSpecification {
	o.typeOfs = typeNext
	return o
}

func (o OffsetSpecification) Offset(offset int64) OffsetSpecification {
	o.typeOfs = typeOffset
	o.offset = offset
	return o
}

func (o OffsetSpecification) Timestamp(offset int64) OffsetSpecification {
	o.typeOfs = typeTimestamp
	o.offset = offset
	return o
}

func (o OffsetSpecification) isOffset() bool {
	return o.typeOfs == typeOffset || o.typeOfs == typeLastConsumed
}

// Deprecated: see LastConsumed()
func (o OffsetSpecification) isLastConsumed() bool {
	return o.typeOfs == typeLastConsumed
}
func (o OffsetSpecification) isTimestamp() bool {
	return o.typeOfs == typeTimestamp
}

// Deprecated: The method name may be misleading.
// The method does not indicate the last message consumed of the stream but the last stored offset.
// The method was added to help the user, but it created confusion.
// Use `QueryOffset` instead.:
//
//		offset, err := env.QueryOffset(consumerName, streamName)
//	 // check the error
//	 ....
//	 SetOffset(stream.OffsetSpecification{}.Offset(offset)).
//
// So in this way it possible to start from the last offset stored and customize the behavior
func (o OffsetSpecification) LastConsumed() OffsetSpecification {
	o.typeOfs = typeLastConsumed
	o.offset = -1
	return o
}

func (o OffsetSpecification) String() string {
	switch o.typeOfs {
	case typeFirst:
		return "first"
	case typeNext:
		return "next"
	case typeLast:
		return "last"
	case typeLastConsumed:
		return "last consumed"
	case typeOffset:
		return fmt.Sprintf("%s, value: %d", "offset", o.offset)
	case typeTimestamp:
		return fmt.Sprintf("%s, value: %d", "time-stamp", o.offset)
	}
	return ""
}
